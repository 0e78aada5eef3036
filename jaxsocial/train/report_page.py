"""report.html: a run or a study as one self-contained page that opens offline.

`write(workdir)` writes `workdir/report.html` for a run directory (metrics.jsonl, feed.jsonl)
or a study directory (study.json, study.md) and returns its path; the run loop calls it after
every epoch and `launch/report.py W` calls it for any directory. The charts are Plotly figures
(`plotly.io.to_html`, validated by plotly.js in the browser) over Plotly's offline bundle,
inlined once in the page's head, so no request leaves the machine. A run's page shows:

- the blog's numbers, total likes and crowd similarity per epoch (one line per cohort as well);
- text drift, persona similarity and the update's metrics per epoch;
- the first and the last epoch's posts as feeds (search box, columns sort on click);
- the action mix, parse failures and invalid actions, the reward's distribution per epoch
  and the last epoch's likes histogram;
- with cohorts, who likes whom as a heatmap per epoch (a slider picks the epoch);
- the last epoch's largest cascades as trees, the cascade sizes' CCDF and the polarisation
  measures per epoch.

A study's page shows every arm's per-epoch mean with its 95% band over seeds (t-interval; one
seed has no band), the study table of study.md and links to the runs' own pages.
"""

from __future__ import annotations

import datetime
import html
import json
import os
import re
from typing import Any, Dict, List, Optional, Sequence

import numpy as np
import plotly.io as pio
import plotly.offline
from scipy import stats

from jaxsocial.train import report
from jaxsocial.train.run_log import read_jsonl

BLOG = (("avg_likes_per_post", "likes per post"), ("zero_like_share", "zero-like share"),
        ("positive_engagement_share", "engaged share"), ("total_posts", "posts"),
        ("total_likes", "total likes"), ("crowd_interest_sim", "crowd interest similarity"))
UPDATE = ("loss", "approx_kl", "kl_ref", "entropy", "grad_norm", "clip_frac")
POLARISATION = ("homophily", "homophily_shuffled", "modularity", "exposure_diversity",
                "split_share")
FEED_COLUMNS = ("likes", "reposts", "comments", "tick", "agent", "cohort", "persona", "text")

_STYLE = """
body{font-family:system-ui,sans-serif;margin:1.5em;color:#222}
h1{font-size:1.4em}h2{font-size:1.15em;margin-top:1.6em;border-bottom:1px solid #ccc}
.grid{display:grid;grid-template-columns:repeat(auto-fill,minmax(360px,1fr));gap:.5em}
.wide{display:grid;grid-template-columns:1fr 1fr;gap:1em}
.feed{max-height:480px;overflow:auto;border:1px solid #ddd}
table{border-collapse:collapse;font-size:.85em;width:100%}
td,th{border-bottom:1px solid #eee;padding:2px 6px;text-align:left;vertical-align:top}
th{background:#f4f4f4;position:sticky;top:0;cursor:pointer}
td.num{text-align:right}.note{color:#666;font-size:.9em}
"""

# The feed tables' search box and sortable columns (not chart code: Plotly draws every chart).
_TABLE_JS = """
document.querySelectorAll('input.search').forEach(function(box){
  box.addEventListener('input', function(){
    var q = box.value.toLowerCase();
    document.getElementById(box.dataset.table).querySelectorAll('tbody tr').forEach(
      function(tr){ tr.style.display = tr.textContent.toLowerCase().includes(q) ? '' : 'none'; });
  });
});
document.querySelectorAll('table.sortable th').forEach(function(th){
  th.addEventListener('click', function(){
    var col = th.cellIndex;
    var body = th.closest('table').tBodies[0], up = th.dataset.up !== '1';
    th.dataset.up = up ? '1' : '0';
    var rows = Array.from(body.rows), num = th.classList.contains('num');
    rows.sort(function(a, b){
      var x = a.cells[col].textContent, y = b.cells[col].textContent;
      var d = num ? parseFloat(x) - parseFloat(y) : x.localeCompare(y);
      return up ? d : -d;
    });
    rows.forEach(function(r){ body.appendChild(r); });
  });
});
"""


def write(workdir: str) -> str:
    """Write `workdir/report.html` for a run directory (metrics.jsonl) or a study directory
    (study.json) and return its path (written whole, then renamed into place, so a reader never
    sees half a page)."""
    if os.path.exists(os.path.join(workdir, "study.json")):
        page = study_page(workdir)
    elif os.path.exists(os.path.join(workdir, "metrics.jsonl")):
        page = run_page(workdir)
    else:
        raise FileNotFoundError(
            f"{workdir}: neither a run directory (no metrics.jsonl) nor a study directory "
            "(no study.json)")
    path = os.path.join(workdir, "report.html")
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        f.write(page)
    os.replace(path + ".tmp", path)
    return path


def _chart(fig: Dict[str, Any], height: int = 320) -> str:
    """One Plotly figure (a {"data", "layout"} dict) as a div and its newPlot call."""
    layout = {"margin": {"l": 50, "r": 20, "t": 40, "b": 40}, "height": height,
              **fig.get("layout", {})}
    return pio.to_html({"data": fig["data"], "layout": layout}, include_plotlyjs=False,
                       full_html=False, validate=False, default_height=f"{height}px",
                       config={"displaylogo": False})


def _lines(title: str, x: Sequence, series: Dict[str, Sequence], xtitle: str = "epoch",
           **layout) -> Dict[str, Any]:
    data = [{"type": "scatter", "mode": "lines+markers", "name": name, "x": list(x),
             "y": [None if v is None or not np.isfinite(v) else v for v in ys]}
            for name, ys in series.items()]
    return {"data": data, "layout": {"title": {"text": title}, "xaxis": _axis(x, xtitle),
                                     "showlegend": len(series) > 1, **layout}}


def _axis(x: Sequence, title: str = "epoch") -> Dict[str, Any]:
    """An x axis of whole numbers (epochs): about ten ticks, none between two epochs."""
    return {"title": title, "tickformat": "d", "dtick": max(1, -(-len(x) // 10))}


def _page(title: str, sections: List[str]) -> str:
    written = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return ("<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
            f"<title>{html.escape(title)}</title><style>{_STYLE}</style>"
            f"<script>{plotly.offline.get_plotlyjs()}</script></head><body>"
            f"<h1>{html.escape(title)}</h1><p class='note'>written {written}</p>"
            + "".join(sections) + f"<script>{_TABLE_JS}</script></body></html>\n")


def _section(anchor: str, title: str, body: str, note: str = "") -> str:
    note = f"<p class='note'>{html.escape(note)}</p>" if note else ""
    return f"<h2 id='{anchor}'>{html.escape(title)}</h2>{note}{body}"


def _grid(charts: Sequence[str]) -> str:
    return "<div class='grid'>" + "".join(f"<div>{c}</div>" for c in charts) + "</div>"


def _get(record: Dict[str, Any], path: str) -> Optional[float]:
    for key in path.split("/"):
        if not isinstance(record, dict) or key not in record:
            return None
        record = record[key]
    return float(record) if isinstance(record, (int, float)) else None


def _total_likes(r: Dict[str, Any]) -> Optional[float]:
    if "total_likes" in r:
        return float(r["total_likes"])
    a, n = r.get("avg_likes_per_post"), r.get("total_posts")
    return None if a is None or n is None else float(a) * float(n)


# ---------------------------------------------------------------------------------- a run


def run_page(workdir: str) -> str:
    """The page of a run directory (see the module docstring)."""
    records = sorted({int(r["epoch"]): r for r in read_jsonl(
        os.path.join(workdir, "metrics.jsonl"))}.values(), key=lambda r: r["epoch"])
    feeds = _first_and_last(os.path.join(workdir, "feed.jsonl"))
    title = f"jaxsocial run: {os.path.basename(os.path.abspath(workdir))}"
    if not records:
        return _page(title, [_section("empty", "No epoch yet",
                                      "<p>metrics.jsonl holds no epoch yet.</p>")])
    epochs = [int(r["epoch"]) for r in records]
    cohorts = list(records[-1].get("cohorts", {}) or {})
    sections = [
        _section("numbers", "The blog's numbers", _blog_charts(records, epochs, cohorts),
                 "Per epoch; with cohorts, one line per cohort beside the whole society."),
        _section("drift", "Text drift and the update", _drift_charts(records, epochs)),
        _section("feed", "The feed: first epoch and last", _feeds(feeds),
                 "The epoch's posts (the first train.text_metrics_posts of them), with the "
                 "likes, reposts and comments each drew within the reward horizon. Type to "
                 "search; click a column to sort."),
        _section("actions", "Actions, parse failures and reward",
                 _action_charts(records, epochs)),
    ]
    if cohorts:
        sections.append(_section("cohorts", "Who likes whom", _who_likes_whom(records, cohorts),
                                 "Likes the agents of each cohort (rows) gave to the posts of "
                                 "each cohort and of the crowd (columns); the slider picks the "
                                 "epoch."))
    sections.append(_section("cascades", "Cascades and polarisation",
                             _cascade_charts(records, epochs),
                             "The last epoch's largest repost / quote trees (box size: the "
                             "node's subtree), the CCDF of cascade sizes, and the follow "
                             "graph's polarisation measures."))
    return _page(title, sections)


def _first_and_last(path: str) -> List[Dict[str, Any]]:
    """The first and the last readable record of a JSONL file ([] if none): feed.jsonl grows
    by up to train.text_metrics_posts posts an epoch, and the page shows only those two."""
    if not os.path.exists(path):
        return []
    first, tail = None, []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                first = line if first is None else first
                tail = (tail + [line])[-2:]  # the last may be torn (a killed run)
    records = []
    for line in [first] + tail[::-1] if first is not None else []:
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return [records[0], records[1]] if len(records) > 1 else records


def _blog_charts(records, epochs, cohorts) -> str:
    charts = []
    for key, label in BLOG:
        series = {"all": [_total_likes(r) if key == "total_likes" else _get(r, key)
                          for r in records]}
        for c in cohorts:
            series[c] = [_total_likes(r["cohorts"][c]) if key == "total_likes"
                         else _get(r, f"cohorts/{c}/{key}") for r in records]
        charts.append(_chart(_lines(label, epochs, series)))
    return _grid(charts)


def _drift_charts(records, epochs) -> str:
    charts = [_chart(_lines("words per post", epochs,
                            {"mean": [_get(r, "drift/mean_post_words") for r in records]})),
              _chart(_lines("text drift (shares)", epochs,
                            {k: [_get(r, f"drift/{k}") for r in records]
                             for k in report.DRIFT_KEYS if k != "mean_post_words"})),
              _chart(_lines("persona similarity", epochs,
                            {"mean": [_get(r, "persona_sim") for r in records]}))]
    charts += [_chart(_lines(f"update: {k}", epochs, {k: [_get(r, f"ppo/{k}") for r in records]}))
               for k in UPDATE if any(_get(r, f"ppo/{k}") is not None for r in records)]
    return _grid(charts)


def _feed_table(table_id: str, entry: Optional[Dict[str, Any]]) -> str:
    if entry is None:
        return "<p>no feed recorded</p>"
    posts = entry["posts"]
    cols = [c for c in FEED_COLUMNS if c != "cohort" or any("cohort" in p for p in posts)]
    num = ("likes", "reposts", "comments", "tick", "agent")
    head = "".join(f"<th class='{'num' if c in num else ''}'>{c}</th>" for c in cols)
    rows = "".join("<tr>" + "".join(
        f"<td class='num'>{p.get(c, '')}</td>" if c in num
        else f"<td>{html.escape(str(p.get(c, '')))}</td>" for c in cols) + "</tr>"
        for p in sorted(posts, key=lambda p: -p["likes"]))
    return (f"<h3>epoch {entry['epoch']}: {len(posts)} posts</h3>"
            f"<input class='search' data-table='{table_id}' placeholder='search'>"
            f"<div class='feed'><table class='sortable' id='{table_id}'><thead><tr>{head}</tr>"
            f"</thead><tbody>{rows}</tbody></table></div>")


def _feeds(feeds: List[Dict[str, Any]]) -> str:
    if not feeds:
        return "<p>no feed.jsonl in this run directory</p>"
    first, last = feeds[0], feeds[-1]
    return ("<div class='wide'><div>" + _feed_table("feed-first", first) + "</div><div>"
            + _feed_table("feed-last", last if last["epoch"] != first["epoch"] else None)
            + "</div></div>")


def _action_charts(records, epochs) -> str:
    kinds = sorted({k for r in records for k in r.get("action_mix", {})})
    mix = {"data": [{"type": "bar", "name": k, "x": epochs,
                     "y": [r.get("action_mix", {}).get(k, 0) for r in records]} for k in kinds],
           "layout": {"title": {"text": "action mix"}, "barmode": "stack",
                      "xaxis": _axis(epochs)}}
    fails = {"parse failures": [r.get("parse_failures", 0) for r in records],
             "invalid actions": [r.get("invalid_actions", 0) for r in records]}
    for k in sorted({k for r in records for k in r.get("parse_failures_by_kind", {})}):
        fails[f"failed: {k}"] = [r.get("parse_failures_by_kind", {}).get(k, 0) for r in records]
    failures = {"data": [{"type": "bar", "name": k, "x": epochs, "y": v}
                         for k, v in fails.items()],
                "layout": {"title": {"text": "parse failures and invalid actions"},
                           "xaxis": _axis(epochs)}}
    boxes = [r.get("reward_box") for r in records]
    if all(boxes):
        reward = {"data": [{"type": "box", "name": "reward", "x": epochs,
                            **{k: [b[k] for b in boxes] for k in ("q1", "median", "q3")},
                            "lowerfence": [b["min"] for b in boxes],
                            "upperfence": [b["max"] for b in boxes],
                            "mean": [r.get("reward_mean") for r in records]}],
                  "layout": {"title": {"text": "reward per trajectory"},
                             "xaxis": _axis(epochs)}}
    else:  # records written before reward_box: mean +- std
        reward = _lines("reward (mean)", epochs, {"mean": [_get(r, "reward_mean")
                                                           for r in records]})
    hist = records[-1].get("likes_hist", [])
    likes = {"data": [{"type": "bar", "x": list(range(len(hist))), "y": hist}],
             "layout": {"title": {"text": f"likes per post, epoch {epochs[-1]}"},
                        "xaxis": {"title": "likes"}, "yaxis": {"title": "posts"}}}
    return _grid([_chart(mix), _chart(failures), _chart(reward), _chart(likes)])


def _who_likes_whom(records, cohorts) -> str:
    cols = cohorts + ["crowd"]
    traces, steps = [], []
    for i, r in enumerate(records):
        z = [[r["cohorts"][a].get("likes_given", {}).get(b, 0) for b in cols] for a in cohorts]
        traces.append({"type": "heatmap", "z": z, "x": cols, "y": cohorts,
                       "visible": i == len(records) - 1, "colorscale": "Blues",
                       "reversescale": True,
                       "texttemplate": "%{z}", "name": f"epoch {r['epoch']}"})
        steps.append({"label": str(r["epoch"]), "method": "update",
                      "args": [{"visible": [j == i for j in range(len(records))]}]})
    fig = {"data": traces, "layout": {
        "title": {"text": "likes given (rows) to posts of (columns)"},
        "xaxis": {"title": "author"}, "yaxis": {"title": "liker", "autorange": "reversed"},
        "sliders": [{"active": len(records) - 1, "steps": steps,
                     "currentvalue": {"prefix": "epoch "}, "pad": {"t": 50}}]}}
    return _chart(fig, height=420)


def _tree(tree: Dict[str, Any]) -> Dict[str, Any]:
    nodes = tree["nodes"]
    root = tree.get("text", "") or f"post {nodes[0]['id']}"
    labels = [f"{root[:60]}" if n["parent"] < 0 else f"{n['kind']} by agent {n['author']}"
              for n in nodes]
    hover = [f"post {n['id']}: {n['kind']} by user {n['author']}, tick {n['created_at']}"
             for n in nodes]
    return {"data": [{"type": "icicle", "ids": [str(n["id"]) for n in nodes], "labels": labels,
                      "parents": ["" if n["parent"] < 0 else str(n["parent"]) for n in nodes],
                      "hovertext": hover, "hoverinfo": "text", "tiling": {"orientation": "v"}}],
            "layout": {"title": {"text": f"cascade of size {tree['size']}"}}}


def _cascade_charts(records, epochs) -> str:
    last = records[-1]
    charts = [_chart(_tree(t)) for t in last.get("cascade_trees", [])]
    if not charts:
        charts.append("<p>No post of the last epoch's society was reposted or quoted.</p>")
    hist = np.asarray(last.get("cascades", {}).get("size_hist", []), float)
    if hist.sum():
        ccdf = hist[::-1].cumsum()[::-1] / hist.sum()
        charts.append(_chart({"data": [{"type": "scatter", "mode": "lines+markers",
                                        "x": list(range(len(hist))), "y": ccdf.tolist()}],
                              "layout": {"title": {"text": f"P(size >= s), epoch {epochs[-1]}"},
                                         "xaxis": {"title": "cascade size s"},
                                         "yaxis": {"type": "log"}}}))
    if any("polarisation" in r for r in records):
        charts.append(_chart(_lines("polarisation of the follow graph", epochs, {
            k: [_get(r, f"polarisation/{k}") for r in records] for k in POLARISATION})))
    return _grid(charts)


# -------------------------------------------------------------------------------- a study


def band(curves: np.ndarray, level: float = 0.95):
    """Per epoch, over seeds (rows of `curves` [seeds, epochs], NaN where a run stopped): the
    mean and the t-interval's low and high ends (NaN where fewer than 2 seeds reached it)."""
    n = np.isfinite(curves).sum(0)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.nansum(curves, 0) / np.where(n > 0, n, np.nan)
        dev = np.where(np.isfinite(curves), curves - mean, 0.0)
        sd = np.sqrt((dev ** 2).sum(0) / np.where(n > 1, n - 1, np.nan))
        half = stats.t.ppf(0.5 + level / 2, np.maximum(n - 1, 1)) * sd / np.sqrt(n)
    return mean, mean - half, mean + half


def _markdown_tables(text: str) -> str:
    """study.md as HTML: its tables as tables, its code blocks as <pre>, every other line as a
    paragraph (**bold** kept)."""
    out, rows, code = [], [], None

    def flush():
        if rows:
            cells = [[html.escape(c.strip()) for c in r.strip().strip("|").split("|")]
                     for r in rows if not set(r.replace("|", "").strip()) <= set("-: ")]
            head = "".join(f"<th>{c}</th>" for c in cells[0])
            body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>"
                           for r in cells[1:])
            out.append(f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")
            rows.clear()
    for line in text.splitlines():
        if line.strip().startswith("```"):
            if code is None:
                flush()
                code = []
            else:
                out.append(f"<pre>{html.escape(chr(10).join(code))}</pre>")
                code = None
        elif code is not None:
            code.append(line)
        elif line.lstrip().startswith("|"):
            rows.append(line)
        else:
            flush()
            if line.strip():
                para = html.escape(line.strip().lstrip("#").strip())
                out.append("<p>" + re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", para) + "</p>")
    flush()
    return "".join(out)


def study_page(workdir: str) -> str:
    """The page of a study directory (see the module docstring)."""
    with open(os.path.join(workdir, "study.json"), encoding="utf-8") as f:
        study = json.load(f)
    level = float(study.get("level", 0.95))
    charts = []
    for i, metric in enumerate(study.get("metrics", [])):
        data = []
        for j, (arm, by_seed) in enumerate(study["runs"].items()):
            rows = [r["curves"][metric] for r in by_seed.values()]
            curves = np.full((len(rows), max(len(r) for r in rows)), np.nan)
            for k, r in enumerate(rows):
                curves[k, :len(r)] = [np.nan if v is None else v for v in r]
            mean, lo, hi = band(curves, level)
            x = list(range(1, curves.shape[1] + 1))
            hue = (j * 137) % 360
            color, fill = f"hsl({hue},60%,45%)", f"hsla({hue},60%,45%,0.2)"

            def fin(a):
                return [None if not np.isfinite(v) else float(v) for v in a]
            edge = {"type": "scatter", "mode": "lines", "x": x, "line": {"width": 0},
                    "legendgroup": arm, "showlegend": False, "hoverinfo": "skip"}
            data += [{**edge, "y": fin(hi)},
                     {**edge, "y": fin(lo), "fill": "tonexty", "fillcolor": fill},
                     {"type": "scatter", "mode": "lines+markers", "x": x, "y": fin(mean),
                      "name": f"{arm} (n={len(rows)})", "legendgroup": arm,
                      "line": {"color": color}}]
        charts.append(_chart({"data": data, "layout": {
            "title": {"text": metric}, "xaxis": _axis(x), "showlegend": i == 0}}))
    table = ""
    md = os.path.join(workdir, "study.md")
    if os.path.exists(md):
        with open(md, encoding="utf-8") as f:
            table = _markdown_tables(f.read())
    links = []
    for arm, by_seed in study["runs"].items():
        for seed, r in by_seed.items():
            page = os.path.join(r.get("workdir") or "", "report.html")
            if r.get("workdir") and os.path.exists(page):
                rel = os.path.relpath(page, workdir)
                links.append(f"<li><a href='{html.escape(rel)}'>{html.escape(arm)}, seed "
                             f"{html.escape(str(seed))}</a></li>")
    title = f"jaxsocial study: {os.path.basename(os.path.abspath(workdir))}"
    return _page(title, [
        _section("curves", "Every arm per epoch", _grid(charts),
                 f"Mean over seeds, band: the {level:.0%} t-interval over seeds (none for "
                 "one seed)."),
        _section("table", "The study table (study.md)", table or "<p>no study.md</p>"),
        _section("runs", "The runs", f"<ul>{''.join(links)}</ul>" if links else
                 "<p>no run page found</p>")])
