"""One `qcls sweep -m …` over several GPUs: the multirun's job list is split over the devices by one swept key,
one `qcls sweep` process runs per device (CUDA_VISIBLE_DEVICES=<id>: it sees one card; the basic launcher runs
its jobs one after another and reuses the loaded model across them), then one merged report.

    python -m qcls.sweep.sweep_gpus --devices 0,1,2,3 --out multirun/gpus -- \\
        -m scoring=trie,first_token,exact,mean_logprob prompts=default,ecommerce8 model=qwen3_4b \\
        model.source=local model.path=/models/Qwen3-4B eval=dev
    python -m qcls.sweep.sweep_gpus --devices 0,1 --one-gpu ...      # also the whole sweep on device 0 alone, timed
    python -m qcls.sweep.sweep_gpus --devices cpu,cpu ...             # two CPU processes (checks the splitting)

The split key: a swept model-loading key (model, backend, gpu, model.* / backend.*) when it has a value for every
device, so that no device loads a model another one needs; else the swept key with the most values (ties: a
loading key first); `--split KEY` chooses. Device j takes that key's values j, j+N, … and every value of the
other keys. Writes OUT/dev<j>/ (each process's sweep and log), OUT/all/ (the merged summary.md, summary.csv,
plots), OUT/sweep_gpus.md and OUT/sweep_gpus.json (the jobs, model loads and wall time per device).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from itertools import product
from pathlib import Path


LOADING = ("model", "backend", "gpu")  # keys whose values need another model load (qcls.sweep.models reuses the rest)


def swept(argv: list[str]) -> list[tuple[int, str, list[str]]]:
    """(position in argv, key with its +/~ prefix, values) of every swept override (Hydra's own parser)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    items = [(i, a) for i, a in enumerate(argv) if not a.startswith("-") and "=" in a]
    parsed = OverridesParser.create().parse_overrides([a for _, a in items])
    out = []
    for (i, item), o in zip(items, parsed):
        if o.is_sweep_override() and not o.get_key_element().startswith("hydra"):
            head = item[:len(item) - len(item.lstrip("+~"))]
            out.append((i, head + o.get_key_element(), [str(v) for v in o.sweep_string_iterator()]))
    return out


def loading(key: str) -> bool:
    return key.lstrip("+~").split(".")[0] in LOADING


def choose(sweeps: list[tuple[int, str, list[str]]], n: int, forced: str | None) -> tuple[int, str, list[str]]:
    if forced:
        hit = [s for s in sweeps if s[1].lstrip("+~") == forced]
        if not hit:
            raise SystemExit(f"--split {forced}: not a swept key of this sweep ({', '.join(s[1] for s in sweeps)})")
        return hit[0]
    full = [s for s in sweeps if loading(s[1]) and len(s[2]) >= n]
    return full[0] if full else max(sweeps, key=lambda s: (min(len(s[2]), n), loading(s[1]), len(s[2])))


def plan(argv: list[str], n: int, forced: str | None = None) -> tuple[str, list[list[str]], int]:
    """The split key, each device's sweep arguments (devices without a value are left out), jobs in all."""
    sweeps = swept(argv)
    if not sweeps:
        raise SystemExit("nothing is swept: give a multirun such as -m scoring=trie,exact prompts=default,ecommerce8")
    pos, key, values = choose(sweeps, n, forced)
    jobs = len(list(product(*(s[2] for s in sweeps))))
    per_device = []
    for j in range(min(n, len(values))):
        mine = values[j::n]
        args = list(argv)
        args[pos] = f"{key}={','.join(mine)}"
        if "-m" not in args and "--multirun" not in args:
            args.insert(0, "-m")  # one value left is still a (one-job) multirun, into its sweep folder
        per_device.append(args)
    return key, per_device, jobs


def run(devices: list[str], per_device: list[list[str]], out: Path, name: str) -> tuple[float, list[dict]]:
    """One `qcls sweep` process per device at once; returns the wall seconds and each process's outcome."""
    procs, t0 = [], time.perf_counter()
    for j, (dev, args) in enumerate(zip(devices, per_device)):
        d = out / f"{name}{j}"
        d.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": "" if dev == "cpu" else dev}
        log = open(d / "sweep.log", "w")
        cmd = [sys.executable, "-m", "qcls.cli", "sweep", *args, f"hydra.sweep.dir={d}"]
        print(f"[sweep-gpus] device {dev}: {' '.join(args)}", flush=True)
        procs.append((j, dev, d, subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT), log))
    outcome, waiting = {}, list(procs)
    while waiting:  # each one's own end time, whichever ends first
        time.sleep(0.5)
        for item in [w for w in waiting if w[3].poll() is not None]:
            j, dev, d, p, log = item
            waiting.remove(item)
            log.close()
            outcome[j] = {"device": dev, "dir": str(d), "rc": p.returncode,
                          "wall_s": round(time.perf_counter() - t0, 1), **jobs_of(d)}
            print(f"[sweep-gpus] device {dev}: exit {p.returncode}, {outcome[j]['jobs']} jobs, {outcome[j]['loads']} "
                  f"model load(s), done {outcome[j]['wall_s']} s after the start", flush=True)
    return time.perf_counter() - t0, [outcome[j] for j in sorted(outcome)]


def jobs_of(d: Path) -> dict:
    res = [json.loads(f.read_text()) for f in sorted(d.glob("*/result.json"))]
    return {"jobs": len(res), "ok": sum(r.get("status") == "ok" for r in res),
            "loads": sum(r.get("status") == "ok" and not r.get("model_reused") for r in res),
            "job_s": round(sum(r.get("job_s") or 0 for r in res), 1)}


def report(a, key: str, jobs: int, wall: float, outcome: list[dict], one: tuple[float, list[dict]] | None,
           merged: str) -> str:
    from qcls.sweep.timing import commit
    lines = [f"## sweep over {len(outcome)} devices (python -m qcls.sweep.sweep_gpus)", "", f"- commit: {commit()}",
             f"- devices: {', '.join(o['device'] for o in outcome)} ({_device()})",
             f"- sweep: `{' '.join(a.sweep)}`: {jobs} jobs, split by `{key}`", f"- merged report: {merged}", "",
             "| device | jobs | ok | model loads | sum of job s | done after s | exit |", "|---" * 7 + "|"]
    for o in outcome:
        lines.append(f"| {o['device']} | {o['jobs']} | {o['ok']} | {o['loads']} | {o['job_s']} | {o['wall_s']} | "
                     f"{o['rc']} |")
    lines += ["", f"Wall time on {len(outcome)} devices: {wall:.1f} s."]
    if one:
        w1, o1 = one
        lines.append(f"The same {o1[0]['jobs']} jobs on one device ({o1[0]['device']}, {o1[0]['loads']} model "
                     f"load(s)): {w1:.1f} s, so {w1 / wall:.2f}× faster on {len(outcome)} (linear: {len(outcome)}×).")
    else:
        lines.append(f"One device not run (--one-gpu runs it); the jobs' own times add up to "
                     f"{sum(o['job_s'] for o in outcome):.1f} s (start-up of each process not included).")
    return "\n".join(lines) + "\n"


def _device() -> str:
    try:
        import torch
        return torch.cuda.get_device_name() if torch.cuda.is_available() else f"cpu ({os.cpu_count()} cores)"
    except ImportError:
        return "?"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--devices", type=lambda v: v.split(","), required=True,
                    help="CUDA device ids, one process each (cpu: a process that sees no GPU)")
    ap.add_argument("--out", type=Path, default=Path("multirun/gpus"))
    ap.add_argument("--split", help="the swept key to split the jobs by (default: chosen as above)")
    ap.add_argument("--one-gpu", action="store_true", help="then the whole sweep on the first device alone, timed")
    ap.add_argument("sweep", nargs=argparse.REMAINDER, help="-- then the `qcls sweep` arguments")
    a = ap.parse_args(argv)
    a.sweep = [x for x in a.sweep if x != "--"]
    key, per_device, jobs = plan(a.sweep, len(a.devices), a.split)
    if len(per_device) < len(a.devices):
        print(f"[sweep-gpus] {key} has {len(per_device)} values: {len(a.devices) - len(per_device)} device(s) idle",
              flush=True)
    wall, outcome = run(a.devices, per_device, a.out, "dev")
    merged = a.out / "all"
    rc = subprocess.run([sys.executable, "-m", "qcls.cli", "sweep", "--report", *(o["dir"] for o in outcome),
                         "--out", str(merged)]).returncode
    one = None
    if a.one_gpu:
        whole = list(a.sweep) if ("-m" in a.sweep or "--multirun" in a.sweep) else ["-m", *a.sweep]
        one = run(a.devices[:1], [whole], a.out, "one_device")
    text = report(a, key, jobs, wall, outcome, one, f"{merged}/summary.md" if rc == 0 else f"failed (exit {rc})")
    print(text, flush=True)
    (a.out / "sweep_gpus.md").write_text(text)
    data = {"split": key, "jobs": jobs, "wall_s": wall, "devices": outcome,
            "one_device": {"wall_s": one[0], "outcome": one[1]} if one else None}
    (a.out / "sweep_gpus.json").write_text(json.dumps(data))
    done = sum(o["jobs"] for o in outcome)
    return 0 if rc == 0 and done == jobs and all(o["rc"] == 0 for o in outcome) else 1


if __name__ == "__main__":
    sys.exit(main())
