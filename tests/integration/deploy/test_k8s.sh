#!/usr/bin/env bash
# The Kubernetes manifests (deploy/k8s/) validated offline by
# k8s_validate.py: built-in kinds against the Kubernetes API's schemas
# (kubernetes-validate, strict), the TFJob against the training operator's
# API (kubeflow-training's models) with its pod templates against the
# API's, and the deployment rules. Broken copies (a misspelt key, an
# unknown restart policy, an unpinned image, a PS with no --memory-limit
# under its container's, the chief as a StatefulSet; and one for each rule
# an operator needs to apply the files as they are: no seccomp profile,
# capabilities kept, privilege escalation, no storage class, a probe of the
# wrong role, a missing liveness probe, no --idle-exit, no
# activeDeadlineSeconds, 2 CPUs for a one-thread worker, a PS without
# --checkpoint-root, a single-stack Service, no word on the image) must
# fail. The two
# packages come from PyPI into a virtual environment in the build folder
# (kept for the next run); when they cannot be installed the test says so
# and is skipped (77).
set -u
SRC=${TSR_SOURCE_DIR:?TSR_SOURCE_DIR not set}
BUILD=${TSR_BUILD_DIR:?TSR_BUILD_DIR not set}
VENV=$BUILD/k8s-venv
PY=$VENV/bin/python
V=$SRC/tests/integration/deploy/k8s_validate.py
if ! "$PY" -c 'import os, sysconfig, kubernetes_validate, jsonschema, yaml
assert os.path.isdir(os.path.join(sysconfig.get_paths()["purelib"], "kubeflow/training/models"))' \
     2>/dev/null; then
  rm -rf "$VENV"
  if ! { /usr/bin/python3 -m venv "$VENV" &&
         "$VENV/bin/pip" install -q --disable-pip-version-check kubernetes-validate==1.37.0 &&
         "$VENV/bin/pip" install -q --disable-pip-version-check --no-deps kubeflow-training==1.9.4; }; then
    rm -rf "$VENV"
    echo "SKIP: kubernetes-validate and kubeflow-training cannot be installed from PyPI here"
    exit 77
  fi
fi
fails=0
"$PY" "$V" "$SRC"/deploy/k8s/*.yaml || fails=1

W=$(mktemp -d /tmp/tsr_k8s_XXXXXX)
trap 'rm -rf "$W"' EXIT
sed 's/^  backoffLimit: 6/  backofLimit: 6/' "$SRC/deploy/k8s/jobs.yaml" >"$W/misspelt.yaml"
sed 's/restartPolicy: OnFailure/restartPolicy: Sometimes/' "$SRC/deploy/k8s/tfjob.yaml" >"$W/policy.yaml"
sed '0,/volumeMounts:/s//volumeMountz:/' "$SRC/deploy/k8s/tfjob.yaml" >"$W/podspec.yaml"
sed 's/image: tessera:0.1.0/image: tessera:latest/' "$SRC/deploy/k8s/jobs.yaml" >"$W/latest.yaml"
sed 's/, "--memory-limit", "1600M"//' "$SRC/deploy/k8s/jobs.yaml" >"$W/psmemory.yaml"
/usr/bin/python3 - "$SRC/deploy/k8s/jobs.yaml" "$W/statefulset.yaml" <<'PY'
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
for d in docs:
    if d.get("kind") == "Job" and d["metadata"]["name"] == "tessera-chief":
        d["apiVersion"], d["kind"] = "apps/v1", "StatefulSet"
        s = d["spec"]
        for k in ("completionMode", "completions", "parallelism", "backoffLimit"):
            s.pop(k)
        s.update(serviceName="tessera", replicas=1,
                 selector={"matchLabels": {"app": "tessera", "role": "chief"}})
        s["template"]["spec"]["restartPolicy"] = "Always"
yaml.safe_dump_all(docs, open(sys.argv[2], "w"))
PY
J=$SRC/deploy/k8s/jobs.yaml T=$SRC/deploy/k8s/tfjob.yaml
sed '/seccompProfile: {type: RuntimeDefault}/d' "$J" >"$W/noseccomp.yaml"
sed '/capabilities: {drop: \[ALL\]}/d' "$T" >"$W/nodrop.yaml"
sed '0,/allowPrivilegeEscalation: false/s//allowPrivilegeEscalation: true/' "$J" >"$W/escalation.yaml"
sed '/^  storageClassName:/d' "$T" >"$W/noclass.yaml"
sed 's/"ps@localhost:2222"/"worker@localhost:2222"/' "$J" >"$W/probewrong.yaml"
sed 's/"--token-file", "\/run\/secrets\/tessera\/token", "--idle-exit", "10m"\]/"--token-file", "\/run\/secrets\/tessera\/token"]/' \
  "$J" >"$W/noidle.yaml"
sed '/activeDeadlineSeconds:/d' "$J" >"$W/nodeadline.yaml"
sed 's/requests: {cpu: "1", memory: 1Gi}/requests: {cpu: "2", memory: 1Gi}/' "$T" >"$W/cpu2.yaml"
sed 's/"--checkpoint-root", "\/data\/checkpoints",//' "$T" >"$W/noroot.yaml"
sed '/ipFamilyPolicy:/d' "$J" >"$W/singlestack.yaml"
sed 's/kind load docker-image/kind load/' "$T" >"$W/noimage.yaml"
/usr/bin/python3 - "$J" "$W/noprobe.yaml" <<'PY'
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
for d in docs:
    if d.get("kind") == "Job" and d["metadata"]["name"] == "tessera-worker":
        d["spec"]["template"]["spec"]["containers"][0].pop("livenessProbe")
text = open(sys.argv[1]).read()
head = text[:text.index("apiVersion:")]
open(sys.argv[2], "w").write(head + yaml.safe_dump_all(docs))
PY
# each broken copy, and what its validation must say
while IFS='|' read -r m want; do
  # a broken copy must differ from the file it came from
  if cmp -s "$W/$m.yaml" "$J" || cmp -s "$W/$m.yaml" "$T"; then
    echo "FAIL the broken copy $m is the file itself (its edit found nothing)"; fails=1; continue
  fi
  if "$PY" "$V" --expect-fail "$W/$m.yaml" >"$W/$m.log" 2>&1 &&
     grep '^FAIL' "$W/$m.log" | grep -q -- "$want"; then
    echo "ok   a broken copy ($m) fails: $(grep '^FAIL' "$W/$m.log" | grep -m1 -- "$want" | cut -c1-150)"
  else
    echo "FAIL a broken copy ($m) passed the validation, or not for its fault ($want)"
    grep '^FAIL' "$W/$m.log" | head -n 5; fails=1
  fi
done <<'LIST'
misspelt|backofLimit
policy|valid against the TFJob schema
podspec|valid against the TFJob schema
latest|pinned image (tessera:latest)
psmemory|--memory-limit (none)
statefulset|the chief is a batch Job (StatefulSet)
noseccomp|restricted: seccompProfile RuntimeDefault or Localhost (None)
nodrop|restricted: capabilities drop ALL
escalation|restricted: allowPrivilegeEscalation false
noclass|names a storage class (None)
probewrong|livenessProbe asks the process for its status (tessera status --probe ps@localhost:2222)
noidle|leaves when no chief is seen (--idle-exit None)
nodeadline|ends at activeDeadlineSeconds (None)
cpu2|requests 1 CPU, the thread it computes on (2)
noroot|--checkpoint-root None
singlestack|asks for both IP families (None)
noimage|says how to load the image into the nodes or push it
noprobe|livenessProbe asks the process for its status (tessera status --probe worker@localhost:2222): none
LIST
[ "$fails" = 0 ]
