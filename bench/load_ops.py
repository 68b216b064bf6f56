"""The operations bench/load.py measures under load: reloads spread over a level (`--reloads`; per swap window the
command's seconds, the seconds to the new configuration's first answer, the p99 of the requests started in it against
outside, GPU memory and busy % (nvidia-smi, the GPUs it sees), the replicas' log lines about each), a Zipf stream's
cache hits (`--zipf`: answers with meta.cache == "hit") and the prediction log's cost (`--prediction-log-ab`)."""
from __future__ import annotations

import multiprocessing
import os
import re
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench import common as C


def log_ab(a, overrides: list[str], measure) -> tuple[list[dict], dict]:
    """Rounds of a fresh app (`measure`: load.py's) without, then with the prediction log (every row and label);
    `log_rows`: rows written."""
    out, folder = [], Path(tempfile.mkdtemp(prefix="qcls-log-ab-"))
    for k, side in ((k, side) for k in range(a.prediction_log_ab) for side in ("off", "on")):
        on = [f"serve.prediction_log.folder={folder / str(k)}", "serve.prediction_log.all_labels=true"] * (side == "on")
        stats, info = measure(a, [*overrides, *on])
        rows = sum(len(p.read_bytes().splitlines()) for p in (folder / str(k)).glob("part-*"))
        out += [{**st, "path": f"{st['path']} log {side} #{k + 1}", "log_rows": rows} for st in stats]
    return out, info


def log_goals(stats: list[dict]) -> list[str]:
    """The log's cost: req/s (mean of the rounds) with it ≥ 0.97 × without, p99 (median) ≤ 1.1 ×."""
    on, off = ([s for s in stats if f" log {side} #" in s["path"]] for side in ("on", "off"))
    if not (on and off):
        return []
    r, p = (statistics.mean(s["rps"] for s in on) / statistics.mean(s["rps"] for s in off),
            statistics.median(s["p99"] for s in on) / statistics.median(s["p99"] for s in off))
    return [f"prediction log on / off ({sum(s['log_rows'] for s in on)} rows written): req/s × {r:.3f} (≥ 0.97: "
            f"{'met' if r >= 0.97 else 'NOT met'}), p99 × {p:.3f} (≤ 1.1: {'met' if p <= 1.1 else 'NOT met'})"]


def reload_sets(overrides: list[str]) -> list[list[str]]:
    """The two configurations the reloads alternate: the few-shot prompt set, then the app's own."""
    return [[*(o for o in overrides if not o.startswith("prompts=")), "prompts=ecommerce8_fewshot"], overrides]


class Reloads:
    """`n` reloads through `qcls reload`'s own function, spread over `seconds`, with GPU memory sampled meanwhile."""

    def __init__(self, n: int, sets: list[list[str]], seconds: float):
        self.n, self.sets, self.seconds, self.windows, self.memory, self.busy = n, sets, seconds, [], {}, {}
        self.done = threading.Event()  # the load goes on until the last reload has answered for a second

    def run(self) -> None:
        if not self.n:
            return self.done.set()
        import ray
        spawn = multiprocessing.get_context("spawn")  # as `qcls reload` runs: its own process, synchronous handles
        t_start, wall = time.perf_counter(), time.time() - time.perf_counter()
        # utilization beside memory: a build that hangs with the GPU busy (a kernel that never ends) or idle (the
        # host threads stuck) are two different bugs
        with C.GpuSampler(0.2, "memory.used") as gpu, C.GpuSampler(0.5) as util:
            for k in range(self.n):
                time.sleep(max(0.0, t_start + (k + 1) * self.seconds / (self.n + 1) - time.perf_counter()))
                t0, want = time.perf_counter(), self.sets[k % 2]
                p = spawn.Process(target=reload_on, args=(ray.get_runtime_context().gcs_address, want))
                p.start()
                p.join()
                self.windows.append((t0, time.perf_counter(), p.exitcode,
                                     next((o for o in want if o.startswith("prompts=")), "the default prompts")))
            time.sleep(1.0)
        self.done.set()
        mine = set(filter(None, os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")))  # (nvidia-smi lists all)
        for t, gpu, mib in gpu.samples:  # the memory.used of the GPUs this run sees, summed per sample time
            if not mine or gpu in mine:
                self.memory[t - wall] = self.memory.get(t - wall, 0) + int(mib)
        for t, gpu, pct_busy in util.samples:
            if not mine or gpu in mine:
                self.busy[t - wall] = max(self.busy.get(t - wall, 0.0), pct_busy)


def reload_log_lines() -> list[str]:
    """What the replicas logged about each reload (the build, the swap, the replaced one's memory) and a health
    probe that found the device threads stuck (their stacks follow it in the replica's log)."""
    import ray
    time.sleep(2.0)  # the replaced configuration is dropped and its memory given back after the swap
    logs = Path(ray._private.worker._global_node.get_logs_dir_path()) / "serve"
    return [ln.strip() for f in sorted(logs.glob("replica_*.log")) for ln in f.read_text(errors="replace").splitlines()
            if "reload:" in ln or "reload refused" in ln or "health probe:" in ln or "device owner:" in ln]


def reload_on(address: str, overrides: list[str]) -> None:
    """`qcls reload OVERRIDES` on this benchmark's cluster (RAY_ADDRESS: another may run on the machine)."""
    os.environ["RAY_ADDRESS"] = address
    from qcls.cli.reload import reload_main
    sys.exit(reload_main(overrides))


def ops_stats(lv, swaps: Reloads, zipf: bool) -> dict:
    """Per reload window: requests started in it, their p99, seconds to the new fingerprint, peak GPU MiB; the
    p99 outside every window; with a Zipf stream, the cache hits' p50."""
    out = {}
    if zipf:
        hits = sorted(r[0] for r in lv.rows if r[6] == "hit")
        out.update(hits=len(hits), hit_p50=C.pct(hits, 50))
    if swaps.windows:
        rows, inside, swap_rows = sorted(lv.rows, key=lambda r: r[4]), set(), []
        for t0, t1, exitcode, prompts in swaps.windows:
            old = next((r[5] for r in reversed(rows) if r[4] < t0), None)
            first_new = min((r[4] + r[0] / 1e3 for r in rows if r[4] >= t0 and r[5] != old), default=float("nan"))
            win = [i for i, r in enumerate(rows) if t0 <= r[4] <= t1]
            inside.update(win)
            mem = [m for t, m in sorted(swaps.memory.items()) if t0 <= t <= t1]
            before = [m for t, m in sorted(swaps.memory.items()) if t < t0]
            after = [m for t, m in sorted(swaps.memory.items()) if t > t1 + 0.5] or ["n/a"]
            busy = [u for t, u in sorted(swaps.busy.items()) if t0 <= t <= t1]
            swap_rows.append({"prompts": prompts, "exit": exitcode, "command_s": t1 - t0, "to_new_s": first_new - t0,
                              "requests": len(win), "p99": C.pct(sorted(rows[i][0] for i in win), 99),
                              "mib": f"{before[-1]} → {max(mem)} → {after[0]}" if mem and before else "n/a",
                              "busy": f"{min(busy):.0f}–{max(busy):.0f}" if busy else "n/a"})
        out.update(swaps=swap_rows, p99_outside=C.pct(sorted(r[0] for i, r in enumerate(rows) if i not in inside), 99))
    return out


def reload_goals(stats: list[dict], log: list[str]) -> list[str]:
    """A swap window a client barely notices (its p99 ≤ 2 × outside, or, the floor one indivisible step sets, ≤ a
    build's longest graph capture + outside: the median over the builds of each one's longest) and a card left as
    found (GPU MiB 0.5 s after the last swap within 32 MiB of after the first)."""
    out = []
    builds = [ln for ln in log if (m := re.search(r"a build of (\d+) steps", ln)) and int(m.group(1)) > 1]
    longest = sorted((float(m.group(1)), m.group(2)) for ln in builds  # (a release of memory is a build of 1)
                     if (m := re.search(r"longest step ([\d.]+) ms \((.*?)\); then", ln)))
    captures = sorted((float(m.group(1)), m.group(2)) for ln in builds
                      if (m := re.search(r"longest graph capture ([\d.]+) ms \((.*?)\)", ln)))
    for s in (s for s in stats if s.get("swaps")):
        worst, outside = max(w["p99"] for w in s["swaps"]), s["p99_outside"]
        line = (f"swap windows: worst p99 {worst:.2f} ms against {outside:.2f} ms outside "
                f"(× {worst / outside:.2f}; ≤ 2: {'met' if worst <= 2 * outside else 'NOT met'}); ")
        if len(captures) < 3:  # a prompt set's first build compiles its kernel shapes: not what a build costs later
            out.append(line + f"a build's longest graph capture: not judged on {len(captures)} build(s)")
        else:
            typical, step = captures[len(captures) // 2], longest[len(longest) // 2]
            floor = typical[0] + outside
            out.append(line + f"a build's longest graph capture {typical[0]:.1f} ms ({typical[1]}; median of "
                       f"{len(captures)} builds) + outside = {floor:.2f} ms ({'met' if worst <= floor else 'NOT met'}); "
                       f"its longest step of any kind {step[0]:.1f} ms ({step[1]}; the longest of all "
                       f"{longest[-1][0]:.1f} ms)")
        after = [int(w["mib"].rsplit("→ ", 1)[1]) for w in s["swaps"] if w["mib"].rsplit("→ ", 1)[-1].isdigit()]
        if len(after) >= 2:
            grew = after[-1] - after[0]
            out.append(f"GPU MiB 0.5 s after swap 1 → after swap {len(after)}: {after[0]} → {after[-1]} "
                       f"({grew:+d}; within 32: {'met' if abs(grew) <= 32 else 'NOT met'})")
    return out


def ops_table(stats: list[dict]) -> str:
    lines = []
    for s in stats:
        if "hit_p50" in s:
            lines.append(f"{s['path']} c={s['concurrency']}: {s['hits']} cache hits, hit p50 {s['hit_p50']:.2f} ms")
        if s.get("swaps"):
            lines += [f"Reloads during {s['path']} c={s['concurrency']}: {s['errors']} failed requests of "
                      f"{s['requests']}; p99 outside the swap windows {s['p99_outside']:.2f} ms", "",
                      "| reload | to | exit | command s | to the new fingerprint s | requests in the window | p99 ms "
                      "| GPU MiB before → peak → 0.5 s after | GPU busy % |", "|---" * 9 + "|"]
            lines += [f"| {k + 1} | {w['prompts']} | {w['exit']} | {w['command_s']:.2f} | {w['to_new_s']:.2f} | "
                      f"{w['requests']} | {w['p99']:.2f} | {w['mib']} | {w['busy']} |" for k, w in enumerate(s["swaps"])]
    return "\n".join(lines) + "\n" if lines else ""
