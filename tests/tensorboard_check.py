"""tests/tensorboard_check.py: the oracles of tests/e2e_tensorboard.sh and tests/e2e_plot.sh.

  events DIR METRICS [--last-step N]
      TensorBoard's own reader (EventAccumulator, from the `tensorboard` package) reads the
      events in DIR; every scalar must be a number of metrics.jsonl with the same steps and
      the same value (as a float32), every number of metrics.jsonl must be a scalar, no step
      may appear twice, and the memory plan must be there as text (TensorBoard's text
      plugin). With --last-step, the events may stop there (a run killed mid-record).
  svg SVG METRICS...
      The SVG `strata plot` drew for these runs, in order: every curve's numbers are the
      rows' own, its pixels map back to them through its panel's box and axes, and every
      memory bar, capacity and measured peak is what the run's last plan row and the rows
      after it say.
Prints one line per finding and exits 1 on any mismatch."""
import json
import math
import struct
import sys
import xml.etree.ElementTree as ET

failures = []


def fail(msg):
    failures.append(msg)
    print("FAIL:", msg)


def f32(x):
    return struct.unpack("f", struct.pack("f", x))[0]


def read_metrics(path):
    rows = []
    for line in open(path):
        line = line.strip()
        if line:
            rows.append(json.loads(line))
    return rows


# metrics.jsonl's key for each tag: "loss/train" and "loss/val" by name, every other tag
# is "<group>/<key>"
def key_of(tag):
    return {"loss/train": "loss", "loss/val": "val_loss"}.get(tag, tag.split("/", 1)[-1])


def check_events(logdir, metrics_path, last_step=None):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ea = EventAccumulator(logdir, size_guidance={"scalars": 0, "tensors": 0})
    ea.Reload()
    rows = read_metrics(metrics_path)
    if last_step is not None:
        rows = [r for r in rows if r["step"] <= last_step]
    want = {}  # key -> [(step, value)]
    for r in rows:
        for k, v in r.items():
            if k == "step" or isinstance(v, (dict, list, str, bool)) or v is None:
                continue
            want.setdefault(k, []).append((r["step"], v))
    tags = ea.Tags()["scalars"]
    got_keys = set()
    n_values = 0
    for tag in tags:
        k = key_of(tag)
        got_keys.add(k)
        events = ea.Scalars(tag)
        steps = [e.step for e in events]
        if len(steps) != len(set(steps)):
            fail(f"{tag}: a step appears twice: {steps}")
        if k not in want:
            fail(f"{tag}: no metrics.jsonl key {k!r}")
            continue
        w = want[k]
        if steps != [s for s, _ in w]:
            fail(f"{tag}: steps {steps[:8]}... != metrics.jsonl's {[s for s, _ in w][:8]}... ({len(steps)} vs {len(w)})")
            continue
        for e, (s, v) in zip(events, w):
            if e.value != f32(v) and not (math.isnan(e.value) and math.isnan(v)):
                fail(f"{tag} at step {s}: TensorBoard has {e.value!r}, metrics.jsonl {v!r} (float32 {f32(v)!r})")
                break
            n_values += 1
    for k in want:
        if k not in got_keys:
            fail(f"metrics.jsonl's {k!r} is no TensorBoard scalar")
    texts = ea.Tags()["tensors"]
    if "memory_plan" not in texts or "memory_plan" not in ea.PluginTagToContent("text"):
        fail(f"no memory_plan text for TensorBoard's text plugin (tensors: {texts})")
    else:
        plans = ea.Tensors("memory_plan")
        steps = [t.step for t in plans]
        if len(steps) != len(set(steps)):
            fail(f"memory_plan: a step appears twice: {steps}")
        for t in plans:
            text = t.tensor_proto.string_val[0].decode()
            if "memory plan per rank" not in text or t.tensor_proto.dtype != 7:
                fail(f"memory_plan at step {t.step} is not the plan as a string: {text[:80]!r}")
    if not failures:
        print(f"ok: {len(tags)} scalars, {n_values} values at {len(rows)} steps equal metrics.jsonl's; "
              f"the memory plan as text at step(s) {[t.step for t in ea.Tensors('memory_plan')]}")


# The curves of `strata plot`: class -> metrics.jsonl key
CURVES = {"train": "loss", "val": "val_loss", "lr": "lr", "tokens_per_s": "tokens_per_s", "step_ms": "step_ms",
          "grad_norm": "grad_norm"}
RIGHT = {"lr", "step_ms"}
CATS = ["params", "grads", "optimizer", "activations", "buffers", "runtime"]


def check_svg(svg_path, metrics_paths):
    ns = {"s": "http://www.w3.org/2000/svg"}
    root = ET.parse(svg_path).getroot()  # well formed, or this raises
    runs = [read_metrics(p) for p in metrics_paths]
    n_curves = n_bars = 0
    for panel in root.iter("{http://www.w3.org/2000/svg}g"):
        if panel.get("class") != "panel" or panel.get("data-panel") == "memory":
            continue
        L, T, R, B = map(float, panel.get("data-box").split())
        x0, x1 = map(float, panel.get("data-x").split())
        axes = {"y": tuple(map(float, panel.get("data-y").split()))}
        if panel.get("data-y2"):
            axes["y2"] = tuple(map(float, panel.get("data-y2").split()))
        for line in panel.findall("s:polyline", ns):
            cls, run = line.get("class"), int(line.get("data-run"))
            key = CURVES[cls]
            rows = [(r["step"], r[key]) for r in runs[run] if r.get(key) is not None]
            pts = [tuple(map(float, p.split(","))) for p in line.get("data-points").split()]
            if len(rows) <= 1600 and pts != [(float(s), float(v)) for s, v in rows]:
                fail(f"{svg_path}: run {run}'s {cls} carries {pts[:3]}..., its rows {rows[:3]}... ({len(pts)} vs {len(rows)})")
            y0, y1 = axes["y2" if cls in RIGHT else "y"]
            pix = [tuple(map(float, p.split(","))) for p in line.get("points").split()]
            for (px, py), (s, v) in zip(pix, pts):
                ex = L + (s - x0) / (x1 - x0) * (R - L)
                ey = B - (v - y0) / (y1 - y0) * (B - T)
                if abs(px - ex) > 0.06 or abs(py - ey) > 0.06:
                    fail(f"{svg_path}: run {run}'s {cls} point ({px}, {py}) is not ({s}, {v}) on its axes ({ex:.2f}, {ey:.2f})")
                    break
            n_curves += 1
        # a run with a series has its curve (two points or more make a line)
        for run, rows in enumerate(runs):
            for cls, key in CURVES.items():
                n = sum(1 for r in rows if r.get(key) is not None)
                if panel.get("data-panel") == {"train": "loss", "val": "loss", "lr": "loss", "tokens_per_s": "speed",
                                               "step_ms": "speed", "grad_norm": "grad_norm"}[cls] and n >= 2:
                    if not any(p.get("class") == cls and int(p.get("data-run")) == run
                               for p in panel.findall("s:polyline", ns)):
                        fail(f"{svg_path}: run {run} has {n} {key} values but no {cls} curve")
    # memory: the last plan row of each run, and the peaks of the rows from there on
    bars = {}
    for el in root.iter():
        if el.get("class") in ("mem", "capacity", "measured", "total"):
            bars[(el.get("class"), int(el.get("data-run")), el.get("data-tier"), el.get("data-category"))] = el
    for run, rows in enumerate(runs):
        at = max((i for i, r in enumerate(rows) if "plan" in r), default=None)
        if at is None:
            continue
        plan = rows[at]["plan"]
        runtime = plan["device"].get("runtime", 0)
        peak = {"device": max(r["device_used_peak_bytes" if runtime else "peak_mem_bytes"] for r in rows[at:]),
                "pinned": max(r["pinned_bytes"] for r in rows[at:])}
        for tier in ("device", "pinned", "host", "nvme"):
            t = plan.get(tier, {})
            need = sum(t.get(c, 0) for c in CATS)
            if need == 0 and tier != "device":
                continue
            for c in CATS:
                el = bars.get(("mem", run, tier, c))
                got = float(el.get("data-bytes")) if el is not None else 0
                if got != t.get(c, 0):
                    fail(f"{svg_path}: run {run}'s {tier} {c} bar is {got}, its plan says {t.get(c, 0)}")
                n_bars += el is not None
            total = bars.get(("total", run, tier, None))
            if total is None or float(total.get("data-bytes")) != need or float(total.get("data-capacity")) != t["capacity"]:
                fail(f"{svg_path}: run {run}'s {tier} total/capacity label does not say {need} of {t['capacity']}")
            cap = bars.get(("capacity", run, tier, None))
            if cap is not None and float(cap.get("data-bytes")) != t["capacity"]:
                fail(f"{svg_path}: run {run}'s {tier} capacity line is at {cap.get('data-bytes')}, not {t['capacity']}")
            if tier in peak and peak[tier] > 0:
                m = bars.get(("measured", run, tier, None))
                if m is None or float(m.get("data-bytes")) != peak[tier]:
                    fail(f"{svg_path}: run {run}'s measured {tier} peak is not {peak[tier]}")
    if not failures:
        print(f"ok: {svg_path}: {n_curves} curves and {n_bars} memory bars of {len(runs)} run(s) match metrics.jsonl")


def main():
    if sys.argv[1] == "events":
        last = None
        if "--last-step" in sys.argv:
            last = int(sys.argv[sys.argv.index("--last-step") + 1])
        check_events(sys.argv[2], sys.argv[3], last)
    elif sys.argv[1] == "svg":
        check_svg(sys.argv[2], sys.argv[3:])
    else:
        sys.exit(f"unknown check {sys.argv[1]}")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
