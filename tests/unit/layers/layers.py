#!/usr/bin/env python3
"""The layering rules of ARCHITECTURE.md, checked against the code.

  layers.py includes SOURCE_ROOT   every #include "..." of every tracked
                                   .c/.h/.cu file outside tests/ against
                                   the rules below
  layers.py links BUILD_DIR        every program the build links (from
                                   meson's build.ninja) against the same
                                   rules, by the project libraries on its
                                   link line

Each file, header and library belongs to one component (the longest path
prefix that names it wins); a component may include or link only itself
and the components listed in its `uses`. A private header (NAME_int.h) may
be included only from its own folder or below it. Exit 0 when everything
holds, 1 with one line per broken rule (the file, the line, the arrow and
the rule it breaks), 2 when the tree or the build cannot be read.
"""
import os
import re
import subprocess
import sys

# name: (paths: folders end in '/', anything else is one file,
#        project libraries (archive names) built from them,
#        the components it may use besides itself)
COMPONENTS = {
    # the build's generated configuration header: anyone
    "config": (["tsr_config.h"], [], []),
    # RPC metas (protoc-c output), the wire itself: the libraries below the
    # roles name the ones they speak, the roles may use any
    "proto.rpc": (["rpc.pb-c.h"], [], []),
    "proto.event": (["event.pb-c.h", "hparams.pb-c.h"], [], []),
    "proto.ps": (["ps.pb-c.h"], [], []),
    "proto.coll": (["coll.pb-c.h"], [], []),
    "proto.roles": (["worker.pb-c.h", "chief.pb-c.h", "example.pb-c.h"],
                    [], []),
    # the one library all the metas are compiled into: anyone links it
    "proto.lib": ([], ["libtsr_proto.a"], []),
    # errors, log, cluster spec, partitioners, the job file, variables, RPC
    "common": (["common/"], ["libtsr_common.a"], ["config", "proto.rpc"]),
    # the compute interface, its backends, the optimizers' update rules
    "kernels": (["kernels/"], ["libtsr_kernels.a", "libtsr_kern_cuda.so"],
                ["config", "common"]),
    # what a training run writes and reads beside the variables:
    # TensorBoard events, metrics, report, .npz, .keras/HDF5
    "artifacts": (["artifacts/"], ["libtsr_artifacts.a"],
                  ["config", "common", "proto.event"]),
    # what the PS server and its client both speak
    "ps.wire": (["ps/wire/"], ["libtsr_ps_wire.a"],
                ["config", "common", "kernels", "proto.ps"]),
    # the collectives (ring all-reduce, broadcast, barrier, gradient
    # buckets) among a group of processes over the RPC: knows no role
    "coll": (["common/coll/"], ["libtsr_coll.a"],
             ["config", "common", "proto.coll"]),
    # the shard file format (reader, writer, validation; FORMAT.md beside
    # it) that the PS writes and reads, the chief verifies and `tessera
    # ckpt` reads
    "shard_format": (["common/ckpt/"], ["libtsr_shardfile.a"],
                     ["config", "common"]),
    # the PS client: the worker and the chief call the PS through it
    "ps.client": (["ps/client/"], ["libtsr_ps_client.a"],
                  ["config", "common", "kernels", "ps.wire", "proto.ps"]),
    # tessera-ps, the server
    "ps": (["ps/"], ["libtsr_ps.a"],
           ["config", "common", "kernels", "ps.wire", "shard_format",
            "proto.ps"]),
    # the worker's RPC method numbers (the chief calls the worker)
    "worker.wire": (["worker/wire.h"], [], []),
    # the model description (variables, shapes, loss from a Keras JSON or
    # a built-in spec), without an executor: the coordinator uses it. Its
    # header names the input schema (types only: the library calls none of
    # the executor, which the test coord_no_worker checks on its objects)
    "worker.model": (["worker/model.h"], ["libtsr_model.a"],
                     ["config", "common", "kernels", "worker.exec"]),
    # what runs a model (input pipeline, executor, metrics, the standalone
    # trainer): the worker's, and the evaluator's beside the chief
    "worker.exec": (["worker/input.h", "worker/metrics.h", "worker/train.h",
                     "worker/model_exec.h"], [],
                    ["config", "common", "kernels", "worker.model"]),
    # tessera-worker
    "worker": (["worker/"], ["libtsr_worker.a"],
               ["config", "common", "kernels", "artifacts", "ps.wire",
                "ps.client", "worker.wire", "worker.model", "worker.exec",
                "coll", "proto.rpc", "proto.ps", "proto.roles"]),
    # the chief's RPC method numbers (`tessera status` calls the chief)
    "chief.wire": (["chief/wire.h"], [], []),
    # the evaluator sidecar runs the model, so it may use the worker's
    # executor; nothing else of chief/ may
    "chief.eval": (["chief/eval/"], ["libtsr_chief_eval.a"],
                   ["config", "common", "kernels", "artifacts", "ps.wire",
                    "ps.client", "worker.model", "worker.exec", "chief",
                    "proto.rpc", "proto.ps", "proto.roles"]),
    # tessera-chief and tessera
    "chief": (["chief/"], ["libtsr_chief.a", "libtsr_chief_core.a",
                           "libtsr_coord_sm.a"],
              ["config", "common", "kernels", "artifacts", "ps.wire",
               "ps.client", "shard_format", "worker.wire", "worker.model",
               "chief.wire", "chief.eval", "proto.rpc", "proto.ps",
               "proto.roles"]),
}

# Programs may link more than their sources include: (program's component,
# library's component): why.
LINK_ALSO = {
    # TF_CONFIG's evaluator task runs in tessera-chief (chief/eval/), and
    # `tessera evaluate` / `tessera predict` in tessera (chief/eval/
    # offline.c): both run the model with the worker's executor
    ("chief", "worker"): "the evaluator sidecar and tessera evaluate run "
                         "the model",
    # ... and the worker library has the workers' ring (dense "allreduce")
    ("chief", "coll"): "the worker library it links for the evaluator "
                       "holds the workers' ring",
}

INCLUDE_RE = re.compile(r'^\s*#\s*include\s*"([^"]+)"')
SOURCE_EXT = (".c", ".h", ".cu", ".cuh")


def check_table():
    bad = []
    for name, (paths, libs, uses) in COMPONENTS.items():
        for u in uses:
            if u not in COMPONENTS:
                bad.append(f"rule table: {name} uses unknown component {u}")
    for (a, b) in LINK_ALSO:
        if a not in COMPONENTS or b not in COMPONENTS:
            bad.append(f"rule table: link {a} -> {b} names an unknown "
                       "component")
    return bad


def owner(path):
    """The component of a path relative to the source root (or a bare
    generated header name), or None."""
    best, best_len = None, -1
    for name, (paths, _, _) in COMPONENTS.items():
        for p in paths:
            hit = path.startswith(p) if p.endswith("/") else path == p
            if hit and len(p) > best_len:
                best, best_len = name, len(p)
    return best


def lib_owner(archive):
    for name, (_, libs, _) in COMPONENTS.items():
        if archive in libs:
            return name
    return None


def allowed(src, dst, link=False):
    return (src == dst or dst in ("config", "proto.lib")
            or dst in COMPONENTS[src][2] or (link and (src, dst) in LINK_ALSO))


def tracked_sources(root):
    try:
        out = subprocess.run(["git", "-C", root, "ls-files", "-z"],
                             check=True, capture_output=True).stdout
        files = [f for f in out.decode().split("\0") if f]
    except (OSError, subprocess.CalledProcessError):
        # not a git checkout (a release tarball): every file but those of
        # hidden folders and of build folders (meson's, with their
        # generated sources)
        files = []
        for d, dirs, names in os.walk(root):
            dirs[:] = [x for x in dirs if not x.startswith(".") and
                       not os.path.exists(os.path.join(d, x, "meson-private"))]
            files += [os.path.relpath(os.path.join(d, n), root) for n in names]
    return sorted(f for f in files
                  if f.endswith(SOURCE_EXT) and not f.startswith("tests/")
                  and os.path.exists(os.path.join(root, f)))


def check_includes(root):
    bad = check_table()
    files = tracked_sources(root)
    if not files:
        print(f"no C sources found under {root}", file=sys.stderr)
        return 2
    n_inc = 0
    for f in files:
        src = owner(f)
        if src is None:
            bad.append(f"{f}: in no component of the rule table "
                       "(tests/unit/layers/layers.py): add its folder")
            continue
        with open(os.path.join(root, f), encoding="utf-8",
                  errors="replace") as fh:
            for ln, line in enumerate(fh, 1):
                m = INCLUDE_RE.match(line)
                if not m:
                    continue
                inc = m.group(1)
                n_inc += 1
                # a path from the root, or a file beside the includer
                here = os.path.normpath(os.path.join(os.path.dirname(f), inc))
                target = here if os.path.exists(os.path.join(root, here)) \
                    else inc
                dst = owner(target)
                if dst is None:
                    bad.append(f"{f}:{ln}: includes \"{inc}\", which is in "
                               "no component of the rule table")
                    continue
                if not allowed(src, dst):
                    bad.append(f"{f}:{ln}: {src} -> {dst} (\"{inc}\"): "
                               f"{src} may use only "
                               f"{', '.join(COMPONENTS[src][2]) or 'itself'}")
                base = os.path.basename(target)
                if base.endswith("_int.h"):
                    hdir = os.path.dirname(target) + "/"
                    if not (os.path.dirname(f) + "/").startswith(hdir):
                        bad.append(f"{f}:{ln}: includes the private header "
                                   f"\"{inc}\" of {hdir} from outside it")
    for b in bad:
        print("FAIL " + b)
    if bad:
        return 1
    print(f"ok: {n_inc} includes of {len(files)} files keep the layering "
          f"of {len(COMPONENTS)} components")
    return 0


LINK_RE = re.compile(r"^build ([^:]+): (\w+_LINKER) ([^|]*)(?:\|(.*))?$")


def check_links(build):
    bad = check_table()
    path = os.path.join(build, "build.ninja")
    try:
        with open(path, encoding="utf-8") as fh:
            lines = fh.read().splitlines()
    except OSError as e:
        print(f"{path}: {e.strerror}", file=sys.stderr)
        return 2
    n_prog = 0
    for line in lines:
        m = LINK_RE.match(line)
        if not m:
            continue
        out = m.group(1).split()[0]
        if out.startswith("tests/") or out.endswith(".a"):
            continue
        src = owner(out)
        if src is None:
            bad.append(f"{out}: a program in no component of the rule "
                       "table (tests/unit/layers/layers.py)")
            continue
        n_prog += 1
        inputs = (m.group(3) + " " + (m.group(4) or "")).split()
        for a in inputs:
            if os.path.isabs(a) or not re.search(r"lib[\w-]+\.(a|so)$", a):
                continue
            dst = lib_owner(os.path.basename(a))
            if dst is None:
                bad.append(f"{out}: links {a}, a library in no component "
                           "of the rule table")
            elif not allowed(src, dst, link=True):
                bad.append(f"{out}: {src} -> {dst} (links {a}): {src} may "
                           f"use only {', '.join(COMPONENTS[src][2])}")
    if n_prog == 0:
        bad.append(f"{path}: no program's link line found (did the format "
                   "of build.ninja change?)")
    for b in bad:
        print("FAIL " + b)
    if bad:
        return 1
    print(f"ok: the {n_prog} programs link only the libraries their "
          "layer may use")
    for (a, b), why in LINK_ALSO.items():
        print(f"also allowed: {a} links {b}: {why}")
    return 0


def main(argv):
    if len(argv) != 3 or argv[1] not in ("includes", "links"):
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        print("usage: layers.py includes SOURCE_ROOT | links BUILD_DIR",
              file=sys.stderr)
        return 2
    if argv[1] == "includes":
        return check_includes(argv[2])
    return check_links(argv[2])


if __name__ == "__main__":
    sys.exit(main(sys.argv))
