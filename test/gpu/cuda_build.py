#!/usr/bin/python3
"""What the CUDA target does on a machine without a GPU (CI): the compiler
builds --target cuda stage executables against libpipec_rt_cuda.so, refuses
what the CUDA runtime cannot run, and such an executable started without a
GPU stops with one clear line.

    /usr/bin/python3 test/gpu/cuda_build.py --pipec build/bin/pipec --workdir DIR

Prints one line per check and `N passed, M failed`. (Training on a GPU is
test/gpu/gpu_e2e.py, run by scripts/test-gpu.sh on a GPU machine.)
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "test", "e2e"))
from e2e_common import Checks, run  # noqa: E402


def error_lines(text):
    return sorted({l for l in text.splitlines() if "error:" in l})


def have_gpu():
    try:
        return subprocess.run(["nvidia-smi", "-L"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pipec", required=True)
    ap.add_argument("--workdir", required=True)
    args = ap.parse_args()
    shutil.rmtree(args.workdir, ignore_errors=True)
    os.makedirs(args.workdir)
    w = args.workdir
    checks = Checks()

    mlp = os.path.join(w, "mlp.onnx")
    resnet = os.path.join(w, "resnet.onnx")
    vgg = os.path.join(w, "vgg.onnx")
    for script, out, extra in (("examples/mlp/make_mlp.py", mlp, ["--hidden", "32,16"]),
                               ("examples/vgg/make_vgg.py", vgg, ["--batch", "4"]),
                               ("examples/resnet/make_resnet.py", resnet, ["--batch", "4", "--width", "4",
                                                                           "--blocks", "1"])):
        rc, text = run(["/usr/bin/python3", os.path.join(ROOT, script), "-o", out] + extra)
        if rc != 0:
            checks.report(False, "generate " + os.path.basename(out), text[-400:])
            return checks.summary()

    # A two-stage CUDA build: small executables linked to the CUDA runtime.
    out = os.path.join(w, "mlp-cuda")
    rc, text = run([args.pipec, "compile", mlp, "--target", "cuda", "--stages", "2", "--microbatches", "2",
                    "-o", out, "--quiet"])
    ok = rc == 0 and all(os.path.exists(os.path.join(out, f"stage{k}")) for k in (0, 1))
    detail = f"exit {rc}"
    if ok:
        manifest = json.load(open(os.path.join(out, "manifest.json")))
        _, ldd = run(["ldd", os.path.join(out, "stage0")])
        ok = manifest.get("target") == "cuda" and "libpipec_rt_cuda.so" in ldd
        detail = (f"manifest target {manifest.get('target')!r}, stage0 "
                  f"{os.path.getsize(os.path.join(out, 'stage0'))} bytes, "
                  f"{'links' if 'libpipec_rt_cuda.so' in ldd else 'does not link'} libpipec_rt_cuda.so")
    else:
        detail += ": " + text[-600:]
    checks.report(ok, "compile --target cuda (2 stages)", detail)
    if ok:
        # The step function updates every weight in one launch and zeroes
        # every gradient in another (multi-tensor kernels), not one per
        # weight.
        _, undefined = run(["nm", "-u", os.path.join(out, "stage1")])
        calls = sorted(set(re.findall(r"pipec_cuda_k_(\w+)", undefined)))
        checks.report({"sgd_multi", "fill_multi"} <= set(calls) and "sgd" not in calls and "fill" not in calls,
                      "CUDA step function: multi-tensor update and zeroing", ", ".join(calls))
        # Stage functions are called through the runtime (CUDA graphs).
        checks.report(re.search(r"\bpipec_rt_run\b", undefined) is not None,
                      "CUDA stage functions run through pipec_rt_run (--cuda-graphs)", "")

    # Without a GPU the stages stop at start-up with one line saying so.
    if ok and not have_gpu():
        rc, text = run([args.pipec, "train", out, "--steps", "2"], timeout=120)
        errs = error_lines(text)
        good = rc != 0 and errs and all("compiled for --target cuda but no CUDA GPU is visible" in e for e in errs)
        checks.report(good, "a CUDA stage without a GPU", f"exit {rc}: {' | '.join(errs)[:400]}")

    # The CPU build of the same model still says cpu.
    out_cpu = os.path.join(w, "mlp-cpu")
    rc, text = run([args.pipec, "compile", mlp, "--stages", "2", "--microbatches", "2", "-o", out_cpu, "--quiet"])
    target = json.load(open(os.path.join(out_cpu, "manifest.json"))).get("target") if rc == 0 else None
    checks.report(rc == 0 and target == "cpu", "compile --target cpu (default)", f"exit {rc}, target {target!r}")

    # A model needing a kernel without a CUDA twin is refused; once every
    # kernel has one, the CNN must build for cuda.
    listed = set(re.findall(r"PIPEC_KERNEL(?:_BYTES)?\(pipec_k_(\w+)\)",
                            open(os.path.join(ROOT, "runtime/include/pipec_kernels.def")).read()))
    twins = set(re.findall(r"PIPEC_CUDA_KERNEL\((\w+),",
                           open(os.path.join(ROOT, "runtime/cuda/cuda_kernels.def")).read()))
    cases = []
    if listed - twins:
        missing = sorted(listed - twins)
        print(f"kernels without a CUDA twin: {', '.join(missing)}")
        if "maxpool2d" in missing:
            cases.append(("ops without a CUDA kernel", [vgg, "--target", "cuda"],
                          ["no CUDA kernel yet for", "pipec_k_maxpool2d (", "MaxPool"]))
    if "conv2d" in twins and "batchnorm_train" in twins:
        o = os.path.join(w, "resnet-cuda")
        rc, text = run([args.pipec, "compile", resnet, "--target", "cuda", "--stages", "2", "--microbatches", "2",
                        "-o", o, "--quiet"])
        checks.report(rc == 0 and os.path.exists(os.path.join(o, "stage1")),
                      "ResNet (conv, batch norm) builds for cuda", f"exit {rc} {text[-300:]}")
    if "maxpool2d" in twins:
        o = os.path.join(w, "vgg-cuda")
        rc, text = run([args.pipec, "compile", vgg, "--target", "cuda", "--stages", "2", "--microbatches", "2",
                        "-o", o, "--quiet"])
        checks.report(rc == 0 and os.path.exists(os.path.join(o, "stage1")),
                      "VGG (max pooling) builds for cuda", f"exit {rc} {text[-300:]}")
        # --check-kernels compares CUDA kernels with the CPU's: a CPU build
        # refuses it (one line, from the stage), a CUDA build without a GPU
        # still says what is missing.
        cpu_vgg = os.path.join(w, "vgg-cpu")
        rc, text = run([args.pipec, "compile", vgg, "--stages", "1", "--microbatches", "1", "-o", cpu_vgg,
                        "--quiet"])
        rc, text = run([args.pipec, "train", cpu_vgg, "--steps", "1", "--quiet", "--check-kernels"])
        errs = error_lines(text)
        checks.report(rc != 0 and any("--check-kernels checks CUDA kernels" in e for e in errs),
                      "--check-kernels on a CPU build refused", f"exit {rc}: {' | '.join(errs)[:300]}")
    # --precision bf16: a CUDA build whose stage descriptions say that the
    # matrix products round to bfloat16 (tensors stay float32).
    o = os.path.join(w, "mlp-cuda-bf16")
    rc, text = run([args.pipec, "compile", mlp, "--target", "cuda", "--precision", "bf16", "--stages", "2",
                    "--microbatches", "2", "-o", o, "--quiet"])
    descs = []
    if rc == 0:
        for k in (0, 1):
            _, meta = run(["strings", os.path.join(o, f"stage{k}")])
            descs.append('"matmul_precision":"bf16"' in meta.replace(" ", "") and '"precision":"f32"'
                         in meta.replace(" ", ""))
    checks.report(rc == 0 and descs == [True, True], "compile --target cuda --precision bf16",
                  f"exit {rc}, stage descriptions bf16 matmuls / f32 tensors: {descs} {text[-300:] if rc else ''}")
    # --activations bf16: the stages' messages are half the bytes of the
    # float32 build's (what the stage binaries were lowered with).
    sizes = {}
    for act in ("f32", "bf16"):
        o = os.path.join(w, f"mlp-cuda-act-{act}")
        rc, text = run([args.pipec, "compile", mlp, "--target", "cuda", "--precision", "bf16", "--activations", act,
                        "--stages", "2", "--microbatches", "2", "-o", o, "--quiet", "--emit-mlir"])
        if rc == 0:
            mlir = open(os.path.join(o, "pipeline.mlir")).read()
            sizes[act] = sorted(set(re.findall(r"pipe\.send [^\n]*: tensor<([^>]*)>", mlir)))
    checks.report(sizes.get("bf16") and all(t.endswith("xbf16") for t in sizes["bf16"])
                  and [t[:-len("bf16")] for t in sizes["bf16"]] == [t[:-len("f32")] for t in sizes.get("f32", [])],
                  "compile --target cuda --activations bf16: bf16 messages",
                  f"sent tensors {sizes} {text[-300:] if rc else ''}")
    # Refusals: one error line, nothing written.
    cases += [
        ("unknown precision", [mlp, "--precision", "f16"], ["--precision is f32, f64 or bf16, got 'f16'"]),
        ("float64 on cuda", [mlp, "--target", "cuda", "--precision", "f64"],
         ["--target cuda trains in float32"]),
        ("unknown target", [mlp, "--target", "tpu"], ["--target is cpu or cuda, got 'tpu'"]),
        ("bf16 activations without bf16 products", [mlp, "--activations", "bf16"],
         ["--activations bf16 needs --precision bf16"]),
        ("unknown activations", [mlp, "--precision", "bf16", "--activations", "f16"],
         ["--activations is f32, bf16 or bf16-casts, got 'f16'"]),
    ]
    for name, cmd, wants in cases:
        o = os.path.join(w, "refused-" + name.replace(" ", "-"))
        rc, text = run([args.pipec, "compile"] + cmd + ["-o", o, "--quiet"])
        errs = error_lines(text)
        stages = [f for f in (os.listdir(o) if os.path.isdir(o) else []) if f.startswith("stage")]
        good = rc not in (0,) and 0 < rc < 128 and len(errs) == 1 and all(x in errs[0] for x in wants) \
            and not stages
        checks.report(good, "refused: " + name, f"exit {rc}: {' | '.join(errs)[:500]}"
                      + (f"; wrote {stages}" if stages else ""))
    return checks.summary()


if __name__ == "__main__":
    sys.exit(main())
