"""The plan command: arguments, the plan as a dict (JSON), its printed table; the help is the package's docstring."""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict
from pathlib import Path

from ...errors import TTSError
from . import platforms
from .capacity import capacity
from .page import render_html
from .simulate import hours, simulate
from .traffic import from_curve, from_trace

PROVISION_S = 180.0  # assumed: a GPU instance's launch and image pull before the engine starts (--provision-s)
FLAT_DAY = ",".join(["1"] * 24)


def prices(items: list[str]) -> dict[str, float]:
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        try:
            out[name.strip().lower()] = float(value)
        except ValueError:
            raise TTSError(f"--price {item!r}: expected GPU=USD_PER_HOUR, e.g. h200=3.5") from None
        if not sep or out[name.strip().lower()] < 0:
            raise TTSError(f"--price {item!r}: expected GPU=USD_PER_HOUR, e.g. h200=3.5")
    return out


def _money(x: float | None, digits: int = 2):
    return None if x is None else round(x, digits)


def build(args: argparse.Namespace) -> tuple[dict, dict]:
    cap = capacity(args.gpu, args.bench, args.loadtest)
    slots = args.slots or cap.preset.max_batch
    if args.trace is not None:
        traffic = from_trace(args.trace, args.peak, args.burst, args.burst_minutes)
    else:
        if args.peak is None:
            raise TTSError("give --peak (concurrent streams at the busiest hour), with --curve or --trace")
        traffic = from_curve(args.curve or FLAT_DAY, args.peak, args.burst, args.burst_minutes)
    if not args.stream_s > 0:
        raise TTSError(f"--stream-s {args.stream_s:g}: give a stream's mean length in seconds (> 0)")
    if args.ready_s is not None:
        ready_s, ready_from = args.ready_s, "--ready-s"
    else:
        ready_s = args.provision_s + (cap.ready_s or 0.0)
        ready_from = (f"--provision-s {args.provision_s:g} (assumed) + engine start "
                      + (f"{cap.ready_s:g} s (bench load_s + warmup_s)" if cap.ready_s is not None else "unmeasured"))
    price = prices(args.price).get(cap.preset.name, prices(args.price).get((args.gpu or "").lower()))
    policies = platforms.all_policies(cap.streams, slots)
    plan = {
        "gpu": cap.preset.name,
        "capacity": {"streams_per_instance": cap.streams, "source": cap.source, "slots": slots,
                     "preset_streams": cap.preset.max_batch,
                     "preset_basis": platforms.preset_basis(cap.preset.name),
                     "ready_s": round(ready_s, 1), "ready_from": ready_from, "notes": list(cap.notes),
                     "levels": [asdict(p) for p in cap.curve]},
        "traffic": {"source": traffic.source, "peak": traffic.peak, "burst": traffic.burst,
                    "burst_minutes": traffic.burst_minutes, "sized_peak": traffic.sized_peak,
                    "stream_s": args.stream_s, "minutes": len(traffic.minutes)},
        "price_per_hour": price,
        "instances_at_capacity": math.ceil(traffic.sized_peak / cap.streams - 1e-9),
        "platforms": [],
    }
    minutes = {}
    for policy in policies:
        ms = simulate(traffic.minutes, cap, policy, slots, ready_s, args.stream_s, args.first_burst_s)
        hs = hours(ms)
        peak = platforms.peak_instances(policy, traffic.sized_peak)
        inst_h, stream_h = sum(h.instance_hours for h in hs), sum(h.stream_hours for h in hs)
        cost = inst_h * price if price is not None else None
        p95s = [h.first_audio_p95_ms for h in hs if h.first_audio_p95_ms is not None]
        plan["platforms"].append({
            "platform": policy.platform, "target_streams_per_instance": round(policy.target, 1),
            "settings": policy.settings, "source": policy.source, "peak_instances": peak,
            "cost_per_hour_at_peak": _money(peak * price if price is not None else None),
            "day": {"instance_hours": round(inst_h, 2), "audio_hours": round(stream_h, 2), "cost": _money(cost),
                    "cost_per_audio_hour": _money(cost / stream_h if cost is not None and stream_h else None, 4),
                    "max_instances": max(h.instances_max for h in hs),
                    "first_audio_p95_ms_worst_hour": round(max(p95s), 1) if p95s else None,
                    "below_realtime": round(sum(h.below_realtime for h in hs)),
                    "refused": round(sum(h.refused for h in hs))},
            "hours": [{k: (round(v, 2) if isinstance(v, float) else v) for k, v in asdict(h).items()} for h in hs]})
        minutes[policy.platform] = ms
    return plan, minutes


def print_plan(plan: dict) -> None:
    c, t = plan["capacity"], plan["traffic"]
    print(f"{plan['gpu']}: {c['streams_per_instance']} streams per instance at 1.2x real time, {c['source']}"
          + (f" (the preset's {c['preset_streams']}: {c['preset_basis']})" if c["source"] == "preset" else "")
          + f"; {c['slots']} slots; ready {c['ready_s']:g} s after a scale-out ({c['ready_from']})")
    for note in c["notes"]:
        print(f"  note: {note}")
    price = plan["price_per_hour"]
    print(f"traffic: {t['source']}, peak {t['peak']:,.0f} x burst {t['burst']:g} = {t['sized_peak']:,.0f} streams; "
          f"{plan['instances_at_capacity']} instances at full capacity; price "
          + (f"${price:g}/h" if price is not None else "not given (--price GPU=USD_PER_HOUR)"))
    for p in plan["platforms"]:
        d = p["day"]
        print(f"\n{p['platform']}: {p['settings']}\n  peak {p['peak_instances']} instances"
              + (f" (${p['cost_per_hour_at_peak']:,.2f}/h)" if p["cost_per_hour_at_peak"] is not None else "")
              + f"; day: {d['instance_hours']:,.1f} instance-h, {d['audio_hours']:,.0f} audio-h"
              + (f", ${d['cost']:,.2f}, ${d['cost_per_audio_hour']:.4f} per audio hour" if d["cost"] is not None
                 else "")
              + f", refused {d['refused']:,}, below real time {d['below_realtime']:,}, worst hour's first audio p95 "
              + (f"{d['first_audio_p95_ms_worst_hour']:,.0f} ms" if d["first_audio_p95_ms_worst_hour"] is not None
                 else "n/a (no measured curve)"))
        print("  hour | instances mean/max | streams wanted max | first audio p95 ms | below real time | refused")
        for h in p["hours"]:
            fa = "-" if h["first_audio_p95_ms"] is None else f"{h['first_audio_p95_ms']:,.0f}"
            print(f"  {h['hour']:>4} | {h['instances_mean']:>8.1f} / {h['instances_max']:<5} | "
                  f"{h['wanted_max']:>18,.0f} | {fa:>18} | {h['below_realtime']:>15,.0f} | {h['refused']:>7,.0f}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ttsengine plan", description=sys.modules[__package__].__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpu", help="the GPU's memory preset (h200, h100, l4, a10g, ...; engine/presets.py); with a "
                                  "bench JSON, its own preset by default")
    ap.add_argument("--bench", type=Path, metavar="JSON", help="a `ttsengine bench` bench.json of this GPU")
    ap.add_argument("--loadtest", type=Path, metavar="JSON", help="a `ttsengine loadtest` loadtest.json of this GPU")
    ap.add_argument("--peak", type=float, help="concurrent streams at the busiest hour")
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--curve", help="comma-separated fractions of --peak, one per hour (default: 24 x 1)")
    src.add_argument("--trace", type=Path, metavar="CSV", help="time,concurrent_streams (seconds or HH:MM[:SS])")
    ap.add_argument("--burst", type=float, default=1.0, help="the first --burst-minutes of each hour want this "
                                                             "many times the hour's streams (default 1)")
    ap.add_argument("--burst-minutes", type=int, default=5)
    ap.add_argument("--stream-s", type=float, default=20.0, help="a stream's mean length (requests = streams x 60 "
                                                                 "/ this, per minute)")
    ap.add_argument("--slots", type=int, help="streams an instance admits (default: the preset's; TTS_MAX_BATCH)")
    ap.add_argument("--price", action="append", default=[], metavar="GPU=USD", help="price per GPU hour, e.g. "
                                                                                   "h200=3.5 (repeatable)")
    ap.add_argument("--ready-s", type=float, help="seconds from a scale-out to a serving instance (default: "
                                                  "--provision-s + the bench's measured engine start)")
    ap.add_argument("--provision-s", type=float, default=PROVISION_S, help="an instance's launch and image pull")
    ap.add_argument("--first-burst-s", type=float, default=0.0, help="seconds a new instance's first minute adds "
                    "to its requests' first audio (lazy graph capture at first use; default 0)")
    ap.add_argument("--out", type=Path, default=Path("plan-out"))
    ap.add_argument("--json", action="store_true", help="print the plan's JSON instead of the table")
    args = ap.parse_args(argv)
    if args.slots is not None and args.slots < 1:
        raise TTSError(f"--slots {args.slots}: give at least 1")
    plan, minutes = build(args)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "plan.json").write_text(json.dumps(plan, indent=2))
    (args.out / "plan.html").write_text(render_html(plan, minutes))
    if args.json:
        print(json.dumps(plan))
    else:
        print_plan(plan)
        print(f"\nwrote {args.out / 'plan.json'} and {args.out / 'plan.html'}")
    return 0
