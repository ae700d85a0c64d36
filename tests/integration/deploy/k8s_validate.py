#!/usr/bin/env python3
"""Validates Kubernetes manifests offline, with no cluster.

Every document of every file given:
  - a built-in kind against the Kubernetes API's JSON schemas, strict (an
    unknown key is an error), by kubernetes-validate;
  - a Kubeflow TFJob against a schema built from the training operator's
    API models (kubeflow-training's generated models: every field's name
    and type, the required ones, the documented enums), with each replica's
    pod template checked against the API's PodTemplateSpec, strict;
  - then the rules Tessera's deployment keeps: a pinned image pulled only
    when absent, and the file saying how to load or push it; requests and a
    memory limit on every container, one CPU for a worker and a PS (the
    threads they compute on); pods as uid 10001 with fsGroup 10001 and the
    "restricted" Pod Security Standard (non-root, no privilege escalation,
    every capability dropped, a seccomp profile, no host namespaces, ports
    or paths); liveness and readiness probes that ask the container's own
    process for its status (tessera status --probe ROLE@localhost:PORT); no
    pod restarted after a clean exit; the chief as a batch Job (never a
    StatefulSet or Deployment) and every Job bounded in time
    (activeDeadlineSeconds); PS and workers that leave when no chief is
    seen (--idle-exit); one ReadWriteMany volume at /data, of a named
    storage class, shared by the chief and every PS, each PS's
    --checkpoint-root the chief's checkpoint folder; a headless Service
    asking for both IP families.

Prints one ok/FAIL line per check and "N passed, N failed"; exits 1 on any
failure. --expect-fail: exits 0 only when something fails (for the
deliberately broken copies the test makes).

Usage: k8s_validate.py [--k8s-version 1.30] [--expect-fail] FILE.yaml...
"""
import argparse
import ast
import os
import re
import sys
import sysconfig

import jsonschema
import kubernetes_validate
import yaml
from kubernetes_validate import utils as kvu
from referencing import Registry, Resource

DEFS_URI = "https://kubernetes.io/api/_definitions.json"
MODELS = os.path.join(sysconfig.get_paths()["purelib"], "kubeflow", "training", "models")


class Report:
    def __init__(self):
        self.passed = 0
        self.failed = 0

    def check(self, ok, what):
        if ok:
            self.passed += 1
            print("ok   " + what)
        else:
            self.failed += 1
            print("FAIL " + what)
        return ok


# ---- the TFJob schema, from kubeflow-training's models -----------------------------
def read_models():
    """class name -> (openapi_types, attribute_map, required attrs, enums)
    read from the generated sources (not imported: the package's __init__
    wants the whole Kubernetes client)."""
    models = {}
    for fn in sorted(os.listdir(MODELS)):
        if not fn.endswith(".py") or fn == "__init__.py":
            continue
        src = open(os.path.join(MODELS, fn)).read()
        for node in ast.parse(src).body:
            if not isinstance(node, ast.ClassDef):
                continue
            types = amap = None
            for st in node.body:
                if isinstance(st, ast.Assign) and isinstance(st.targets[0], ast.Name):
                    if st.targets[0].id == "openapi_types":
                        types = ast.literal_eval(st.value)
                    elif st.targets[0].id == "attribute_map":
                        amap = ast.literal_eval(st.value)
            if types is None:
                continue
            required = set(re.findall(r"Invalid value for `(\w+)`, must not be `None`", src))
            enums = {}
            for attr in types:
                m = re.search(r"def %s\(self\):\s*\"\"\"[^\"]*?One of ([\w, ]+?) and (\w+)\." % attr, src)
                if m:
                    enums[attr] = [v.strip() for v in m.group(1).split(",")] + [m.group(2)]
            models[node.name] = (types, amap, required, enums)
    return models


def k8s_ref(defs, v1name):
    """V1PodTemplateSpec -> a $ref into the API definitions"""
    name = v1name[2:]
    keys = [k for k in defs if k.endswith(".v1." + name)]
    if not keys:
        raise KeyError("no API definition for " + v1name)
    return {"$ref": "%s#/$defs/%s" % (DEFS_URI, sorted(keys, key=len)[0])}


def model_schema(models, defs, cls, out):
    if cls in out:
        return {"$ref": "#/$defs/" + cls}
    out[cls] = None  # a sentinel: a class met again while its schema is built (a cycle)
    types, amap, required, enums = models[cls]
    props = {}
    for attr, t in types.items():
        s = type_schema(models, defs, t, out)
        if attr in enums:
            s = {"allOf": [s, {"enum": enums[attr]}]}
        props[amap[attr]] = s
    out[cls] = {"type": "object", "properties": props, "additionalProperties": False,
                "required": sorted(amap[a] for a in required)}
    return {"$ref": "#/$defs/" + cls}


def type_schema(models, defs, t, out):
    prims = {"int": {"type": "integer"}, "str": {"type": "string"},
             "bool": {"type": "boolean"}, "float": {"type": "number"},
             "object": {}, "datetime": {"type": "string"}}
    if t in prims:
        return prims[t]
    m = re.fullmatch(r"list\[(.+)\]", t)
    if m:
        return {"type": "array", "items": type_schema(models, defs, m.group(1), out)}
    m = re.fullmatch(r"dict\(str, (.+)\)", t)
    if m:
        return {"type": "object",
                "additionalProperties": type_schema(models, defs, m.group(1), out)}
    if t in models:
        return model_schema(models, defs, t, out)
    if t.startswith("V1"):
        return k8s_ref(defs, t)
    keys = [k for k in defs if k.endswith("." + t)]  # e.g. Quantity
    if keys:
        return {"$ref": "%s#/$defs/%s" % (DEFS_URI, sorted(keys, key=len)[0])}
    raise KeyError("unknown model type " + t)


def tfjob_validator(version):
    defs_doc = kvu.schema_contents(
        "kubernetes-json-schema/v%s.0-local-strict/_definitions.json" % version, version)
    models = read_models()
    out = {}
    top = model_schema(models, defs_doc["$defs"], "KubeflowOrgV1TFJob", out)
    tf = out["KubeflowOrgV1TFJob"]
    tf["properties"]["apiVersion"] = {"const": "kubeflow.org/v1"}
    tf["properties"]["kind"] = {"const": "TFJob"}
    tf["required"] = sorted(set(tf["required"]) | {"apiVersion", "kind", "metadata", "spec"})
    # the operator accepts these replica types only (TFJob validation)
    spec = out["KubeflowOrgV1TFJobSpec"]
    spec["properties"]["tfReplicaSpecs"]["propertyNames"] = {
        "enum": ["Chief", "Master", "PS", "Worker", "Evaluator"]}
    schema = {"$schema": "https://json-schema.org/draft/2020-12/schema",
              "$id": "https://kubeflow.org/schema/tfjob-v1.json",
              "$defs": out}
    schema.update(top)
    registry = Registry().with_resource(DEFS_URI, Resource.from_contents(defs_doc))
    return jsonschema.Draft202012Validator(schema, registry=registry)


# ---- Tessera's rules ----------------------------------------------------------------
def pod_templates(doc):
    """(name, role, pod template spec, job-level backoff) of a document"""
    kind = doc.get("kind")
    name = doc.get("metadata", {}).get("name", "?")
    if kind == "TFJob":
        for rtype, rs in doc["spec"]["tfReplicaSpecs"].items():
            yield "%s/%s" % (name, rtype), rtype.lower(), rs.get("template", {}).get("spec", {}), rs
    elif kind in ("Job", "StatefulSet", "Deployment", "Pod"):
        spec = doc.get("spec", {})
        tmpl = spec if kind == "Pod" else spec.get("template", {}).get("spec", {})
        yield "%s/%s" % (kind.lower(), name), None, tmpl, spec


def res_of(c):
    return c.get("resources", {})


def role_of(container, role):
    if role:
        return role
    cmd = " ".join(container.get("command", []) + container.get("args", []))
    for r in ("chief", "ps", "worker"):
        if re.search(r"\btessera-%s\b" % r, cmd):
            return r
    return None


UNITS = {"": 1, "k": 1000, "M": 1000 ** 2, "G": 1000 ** 3, "T": 1000 ** 4,
         "Ki": 1024, "Mi": 1024 ** 2, "Gi": 1024 ** 3, "Ti": 1024 ** 4}


def k8s_bytes(q):
    """a Kubernetes memory quantity ("2Gi", "1500M") in bytes, or None"""
    m = re.fullmatch(r"([0-9.]+)([kMGT]i?|)", str(q))
    return float(m.group(1)) * UNITS[m.group(2)] if m else None


def ps_bytes(v):
    """a tessera-ps --memory-limit value ("1600M" = 1600 MiB) in bytes, or None"""
    m = re.fullmatch(r"([0-9.]+)([kKmMgGtT]?)(i?B?)", v)
    if not m:
        return None
    return float(m.group(1)) * 1024 ** " KMGT".index(m.group(2).upper() or " ")


def cpu_cores(q):
    """a Kubernetes CPU quantity ("1", "500m", "1.5") in cores, or None"""
    m = re.fullmatch(r"([0-9.]+)(m?)", str(q))
    return float(m.group(1)) / (1000 if m.group(2) else 1) if m else None


def arg_after(args, flag):
    return args[args.index(flag) + 1] if flag in args and args.index(flag) + 1 < len(args) else None


DURATION = re.compile(r"[0-9.]+[smh]?")


def check_restricted(where, pod, rep):
    """the "restricted" Pod Security Standard (Kubernetes 1.30)"""
    sc = pod.get("securityContext", {})
    rep.check(not any(pod.get(k) for k in ("hostNetwork", "hostPID", "hostIPC")),
              "%s: restricted: no host namespaces" % where)
    rep.check(not any("hostPath" in v for v in pod.get("volumes", [])),
              "%s: restricted: no hostPath volume" % where)
    for c in pod.get("initContainers", []) + pod.get("containers", []):
        cw = "%s container %s" % (where, c.get("name"))
        csc = c.get("securityContext", {})
        non_root = csc.get("runAsNonRoot", sc.get("runAsNonRoot")) is True
        uid = csc.get("runAsUser", sc.get("runAsUser"))
        rep.check(non_root and uid != 0, "%s: restricted: runAsNonRoot, uid %s" % (cw, uid))
        seccomp = csc.get("seccompProfile", sc.get("seccompProfile", {})).get("type")
        rep.check(seccomp in ("RuntimeDefault", "Localhost"),
                  "%s: restricted: seccompProfile RuntimeDefault or Localhost (%s)" % (cw, seccomp))
        rep.check(csc.get("allowPrivilegeEscalation") is False and not csc.get("privileged"),
                  "%s: restricted: allowPrivilegeEscalation false, not privileged" % cw)
        caps = csc.get("capabilities", {})
        rep.check("ALL" in caps.get("drop", []) and
                  set(caps.get("add", [])) <= {"NET_BIND_SERVICE"},
                  "%s: restricted: capabilities drop ALL (add %s)" % (cw, caps.get("add", [])))
        rep.check(not any(p.get("hostPort") for p in c.get("ports", [])),
                  "%s: restricted: no hostPort" % cw)


def check_probes(cw, c, r, rep):
    ports = [p.get("containerPort") for p in c.get("ports", [])]
    want = "%s@localhost:%s" % (r, ports[0] if ports else "?")
    for kind in ("livenessProbe", "readinessProbe"):
        cmd = c.get(kind, {}).get("exec", {}).get("command", [])
        ok = (cmd[:3] == ["tessera", "status", "--probe"] and arg_after(cmd, "--probe") == want
              and arg_after(cmd, "--token-file") is not None)
        rep.check(ok, "%s: %s asks the process for its status (tessera status --probe %s): %s" %
                  (cw, kind, want, " ".join(cmd) or "none"))


def check_rules(docs, fname, rep, text=""):
    base = os.path.basename(fname)
    rep.check("kind load docker-image" in text and "docker push" in text,
              "%s: says how to load the image into the nodes or push it" % base)
    pvcs = {d["metadata"]["name"]: d for d in docs if d.get("kind") == "PersistentVolumeClaim"}
    for name, d in pvcs.items():
        sc = d.get("spec", {}).get("storageClassName")
        rep.check(bool(sc), "%s: claim %s names a storage class (%s)" % (base, name, sc))
    for d in docs:
        if d.get("kind") == "Service" and d.get("spec", {}).get("clusterIP") == "None":
            pol = d["spec"].get("ipFamilyPolicy")
            rep.check(pol in ("PreferDualStack", "RequireDualStack"),
                      "%s: Service %s asks for both IP families (%s)" %
                      (base, d["metadata"]["name"], pol))
        if d.get("kind") == "Job":
            ad = d.get("spec", {}).get("activeDeadlineSeconds")
            rep.check(isinstance(ad, int) and ad > 0, "%s: Job %s ends at activeDeadlineSeconds (%s)" %
                      (base, d["metadata"]["name"], ad))
        if d.get("kind") == "TFJob":
            ad = d.get("spec", {}).get("runPolicy", {}).get("activeDeadlineSeconds")
            rep.check(isinstance(ad, int) and ad > 0, "%s: TFJob %s ends at activeDeadlineSeconds (%s)" %
                      (base, d["metadata"]["name"], ad))
    chief_ckpt = set()
    ps_roots = []
    data_claims = {}  # role -> claim mounted at /data
    for doc in docs:
        kind = doc.get("kind")
        for where, role, pod, owner in pod_templates(doc):
            where = "%s %s" % (os.path.basename(fname), where)
            sc = pod.get("securityContext", {})
            rep.check(sc.get("runAsUser") == 10001 and sc.get("fsGroup") == 10001 and
                      sc.get("runAsNonRoot") is True,
                      "%s: runs as uid 10001, fsGroup 10001, runAsNonRoot" % where)
            rp = owner.get("restartPolicy", pod.get("restartPolicy"))
            rep.check(kind != "StatefulSet" and kind != "Deployment" and rp in ("OnFailure", "Never"),
                      "%s: a finished pod is not started again (%s, restartPolicy %s)" % (where, kind, rp))
            check_restricted(where, pod, rep)
            vols = {v["name"]: v for v in pod.get("volumes", [])}
            for c in pod.get("containers", []):
                r = role_of(c, role)
                cw = "%s container %s" % (where, c.get("name"))
                args = c.get("command", []) + c.get("args", [])
                if r:
                    check_probes(cw, c, r, rep)
                if r in ("ps", "worker"):
                    cpu = cpu_cores(res_of(c).get("requests", {}).get("cpu", ""))
                    rep.check(cpu == 1, "%s: requests 1 CPU, the thread it computes on (%s)" %
                              (cw, res_of(c).get("requests", {}).get("cpu")))
                    ie = arg_after(args, "--idle-exit")
                    rep.check(ie is not None and DURATION.fullmatch(ie) is not None,
                              "%s: leaves when no chief is seen (--idle-exit %s)" % (cw, ie))
                if r == "ps":
                    ps_roots.append((cw, arg_after(args, "--checkpoint-root")))
                img = c.get("image", "")
                rep.check(re.fullmatch(r"[^:@]+(:[\w][\w.-]*|@sha256:[0-9a-f]+)", img) is not None
                          and not img.endswith(":latest"),
                          "%s: pinned image (%s)" % (cw, img))
                rep.check(c.get("imagePullPolicy") == "IfNotPresent",
                          "%s: imagePullPolicy IfNotPresent" % cw)
                res = c.get("resources", {})
                rep.check("cpu" in res.get("requests", {}) and "memory" in res.get("requests", {})
                          and "memory" in res.get("limits", {}),
                          "%s: cpu and memory requests, memory limit" % cw)
                if r == "ps":
                    # the PS keeps its shards under --memory-limit; the
                    # process needs room beyond them in its container
                    args = c.get("command", []) + c.get("args", [])
                    ml = args[args.index("--memory-limit") + 1] if "--memory-limit" in args else ""
                    lim = k8s_bytes(res.get("limits", {}).get("memory", ""))
                    got = ps_bytes(ml)
                    rep.check(got is not None and lim is not None and 0 < got <= 0.85 * lim,
                              "%s: --memory-limit %s within 85%% of the container's limit %s" %
                              (cw, ml or "(none)", res.get("limits", {}).get("memory")))
                if r == "chief":
                    rep.check(kind in ("Job", "TFJob"), "%s: the chief is a batch Job (%s)" % (cw, kind))
                    args = c.get("command", []) + c.get("args", [])
                    ck = args[args.index("--checkpoint-dir") + 1] if "--checkpoint-dir" in args else ""
                    rep.check(ck.startswith("/data/"), "%s: checkpoints under /data (%s)" % (cw, ck))
                    chief_ckpt.add(ck)
                if r in ("chief", "ps"):
                    claim = None
                    for m in c.get("volumeMounts", []):
                        v = vols.get(m["name"], {})
                        if m.get("mountPath") == "/data" and "persistentVolumeClaim" in v:
                            claim = v["persistentVolumeClaim"]["claimName"]
                    rep.check(claim is not None, "%s: /data is a persistent volume claim" % cw)
                    data_claims.setdefault(claim, set()).add(r)
    for cw, root in ps_roots:
        rep.check(root is not None and root in chief_ckpt,
                  "%s: --checkpoint-root %s, the chief's checkpoint folder (%s)" %
                  (cw, root, ", ".join(sorted(chief_ckpt))))
    shared = [c for c, roles in data_claims.items() if c and roles == {"chief", "ps"}]
    rep.check(len(data_claims) == 1 and len(shared) == 1,
              "%s: the chief and every PS share one /data claim (%s)" %
              (os.path.basename(fname), ", ".join(str(c) for c in data_claims)))
    for c in shared:
        modes = pvcs.get(c, {}).get("spec", {}).get("accessModes", [])
        rep.check("ReadWriteMany" in modes, "%s: claim %s is ReadWriteMany (%s)" %
                  (os.path.basename(fname), c, modes))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--k8s-version", default="1.30")
    ap.add_argument("--expect-fail", action="store_true")
    ap.add_argument("files", nargs="+")
    a = ap.parse_args()
    rep = Report()
    tfv = tfjob_validator(a.k8s_version)
    for fname in a.files:
        text = open(fname).read()
        docs = [d for d in yaml.safe_load_all(text) if d]
        for d in docs:
            what = "%s %s/%s" % (os.path.basename(fname), d.get("kind"),
                                 d.get("metadata", {}).get("name"))
            if d.get("apiVersion", "").startswith("kubeflow.org/"):
                errs = sorted(tfv.iter_errors(d), key=lambda e: list(e.absolute_path))
                rep.check(not errs, "%s: valid against the TFJob schema%s" % (
                    what, "".join("\n     %s: %s" % (".".join(map(str, e.absolute_path)), e.message)
                                  for e in errs[:5])))
            else:
                try:
                    kubernetes_validate.validate(d, a.k8s_version, strict=True)
                    rep.check(True, "%s: valid against the Kubernetes %s API (strict)" %
                              (what, a.k8s_version))
                except kubernetes_validate.ValidationError as e:
                    rep.check(False, "%s: %s: %s" % (what, ".".join(map(str, e.path)), e.message))
                except kubernetes_validate.SchemaNotFoundError as e:
                    rep.check(False, "%s: %s" % (what, e.message))
        check_rules(docs, fname, rep, text)
    print("%d passed, %d failed" % (rep.passed, rep.failed))
    if a.expect_fail:
        return 0 if rep.failed else 1
    return 1 if rep.failed else 0


if __name__ == "__main__":
    sys.exit(main())
