#!/usr/bin/env bash
# The Kubernetes manifests (deploy/k8s/) validated offline by
# k8s_validate.py: built-in kinds against the Kubernetes API's schemas
# (kubernetes-validate, strict), the TFJob against the training operator's
# API (kubeflow-training's models) with its pod templates against the
# API's, and the deployment rules. Broken copies (a misspelt key, an
# unknown restart policy, an unpinned image, a PS with no --memory-limit
# under its container's, the chief as a StatefulSet) must fail. The two
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
for m in misspelt policy podspec latest psmemory statefulset; do
  if "$PY" "$V" --expect-fail "$W/$m.yaml" >"$W/$m.log" 2>&1; then
    echo "ok   a broken copy ($m) fails: $(grep -m1 '^FAIL' "$W/$m.log" | cut -c1-150)"
  else
    echo "FAIL a broken copy ($m) passed the validation"; cat "$W/$m.log"; fails=1
  fi
done
[ "$fails" = 0 ]
