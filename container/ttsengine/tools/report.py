"""The HTML page of a sweep report (bench, loadtest): three plots over the concurrency levels, the report's
settings, and the levels as a table. matplotlib is imported only here, only when a page is made."""

from __future__ import annotations

import base64
import io


def three_axes():
    """-> (figure, 3 axes) on the non-interactive backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(1, 3, figsize=(15, 4))


def page(title: str, report: dict, fig, skip: tuple[str, ...] = ("levels",), extra: str = "") -> str:
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    img = base64.b64encode(buf.getvalue()).decode()
    levels = report["levels"]
    head = "".join(f"<th>{k}</th>" for k in levels[0])
    rows = "".join("<tr>" + "".join(f"<td>{fmt(v)}</td>" for v in lv.values()) + "</tr>" for lv in levels)
    meta = "".join(f"<li><b>{k}</b>: {v}</li>" for k, v in report.items() if k not in skip)
    return (f"<html><head><meta charset='utf-8'><title>{title}</title></head><body><h1>{title}</h1>"
            f"<ul>{meta}</ul><img src='data:image/png;base64,{img}'/><table border=1 cellpadding=3>"
            f"<tr>{head}</tr>{rows}</table>{extra}</body></html>")


def fmt(v) -> str:
    return f"{v:.3g}" if isinstance(v, float) else str(v)
