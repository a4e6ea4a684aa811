"""The plan's HTML page: streams wanted against each platform's serving capacity, instances billed, and first
audio p95 per hour (the sweep page's layout: tools/report.py)."""

from __future__ import annotations

from .. import report as report_page


def render_html(plan: dict, minutes: dict[str, list]) -> str:
    """`minutes`: platform -> its simulate.Minute list."""
    fig, axes = report_page.three_axes()
    streams = plan["capacity"]["streams_per_instance"]
    first = next(iter(minutes.values()))
    hours_axis = [m / 60 for m in range(len(first))]
    axes[0].plot(hours_axis, [m.wanted for m in first], color="black", label="streams wanted")
    for name, ms in minutes.items():
        axes[0].plot(hours_axis, [m.ready * streams for m in ms], label=f"{name} capacity")
        axes[1].plot(hours_axis, [m.billed for m in ms], label=name)
    for p in plan["platforms"]:
        rows = [h for h in p["hours"] if h["first_audio_p95_ms"] is not None]
        axes[2].plot([h["hour"] for h in rows], [h["first_audio_p95_ms"] for h in rows], "o-", label=p["platform"])
    axes[0].set(title="streams wanted vs served at capacity", xlabel="hour")
    axes[1].set(title="instances billed", xlabel="hour")
    axes[2].set(title="first audio p95 (ms, measured curve)", xlabel="hour")
    for ax in axes:
        ax.legend()
    table = {**{k: v for k, v in plan.items() if k != "platforms"},
             "levels": [{"platform": p["platform"], **h} for p in plan["platforms"] for h in p["hours"]]}
    settings = "".join(f"<li><b>{p['platform']}</b>: {p['settings']}; peak {p['peak_instances']} instances; day "
                       f"{p['day']}</li>" for p in plan["platforms"])
    return report_page.page("ttsengine plan", table, fig, extra=f"<h2>platforms</h2><ul>{settings}</ul>")
