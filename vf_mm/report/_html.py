"""The page: template, CSS, JS (all inline; the script is pinned by its hash in the CSP).

One template draws both kinds of report. The single file (``_CSP``) allows images and
media from ``data:`` URIs only. A page of a paged report (``_PAGED_CSP``) allows images
and media from ``'self'`` only: files beside it (the run's ``assets/``, its own
``frames/``), which from ``file://`` and from a web server alike is never the network
(``'self'`` is the page's own origin; ``http(s)`` images stay links). Both pin the one
script by its hash.
"""

from __future__ import annotations

import base64
import functools
import hashlib

import jinja2

from vf_mm.report._views import _plural

_CSS = """
:root{--fg:#1d2330;--muted:#5f6b7a;--line:#dde2ea;--bg:#f4f6f9;--card:#fff;--err:#b42318;
--errbg:#fdecea;--warn:#8a5a00;--warnbg:#fff6db;--code:#f6f8fa}
*{box-sizing:border-box}
body{margin:0;font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:var(--fg);
background:var(--bg)}
main{max-width:1180px;margin:0 auto;padding:16px 20px 80px}
h1{font-size:20px;margin:4px 0 2px}
h2{font-size:15px;margin:0}
.sub{color:var(--muted);margin-bottom:12px;word-break:break-all}
.badge{display:inline-block;padding:1px 8px;border-radius:10px;font-size:12px;font-weight:600}
.badge.interrupted{background:var(--warnbg);color:var(--warn);border:1px solid #f0d48a}
.panels{display:grid;grid-template-columns:repeat(auto-fit,minmax(330px,1fr));gap:12px}
.panel{background:var(--card);border:1px solid var(--line);border-radius:8px;padding:10px 12px}
.panel h3{margin:0 0 6px;font-size:13px;text-transform:uppercase;letter-spacing:.04em;
color:var(--muted)}
table.kv{border-collapse:collapse;width:100%}
table.kv th,table.kv td{text-align:left;vertical-align:top;padding:3px 8px 3px 0;
border-top:1px solid var(--line)}
table.kv tr:first-child th,table.kv tr:first-child td{border-top:0}
table.kv th{font-weight:600;white-space:nowrap;color:var(--muted);width:1%}
table.kv td.num{font-variant-numeric:tabular-nums}
.warnings{background:var(--warnbg);color:var(--warn);border:1px solid #f0d48a;border-radius:8px;
padding:8px 12px 8px 28px;margin:12px 0}
.warnings li{margin:2px 0;word-break:break-word}
.controls{position:sticky;top:0;z-index:5;display:flex;flex-wrap:wrap;gap:14px;align-items:center;
background:var(--bg);padding:10px 0;border-bottom:1px solid var(--line);margin:14px 0 10px}
.controls[hidden]{display:none}
.controls label{display:flex;gap:6px;align-items:center}
.controls input[type=text]{width:170px;padding:3px 6px}
.controls .count{margin-left:auto;color:var(--muted)}
.card{background:var(--card);border:1px solid var(--line);border-radius:8px;margin:12px 0;
padding:10px 14px;scroll-margin-top:56px}
.card.has-error{border-color:#f1aca5;box-shadow:inset 4px 0 0 var(--err)}
.card[hidden]{display:none}
.card>header{display:flex;gap:10px;align-items:center;flex-wrap:wrap}
.card>header .meta{color:var(--muted)}
.card>header .anchor{margin-left:auto;color:var(--muted);text-decoration:none}
.reward{min-width:54px;text-align:center;color:#fff;border-radius:6px;padding:2px 8px;
font-weight:700;font-variant-numeric:tabular-nums}
.reward.none{background:#8d96a3}
.reward.nonfinite{background:#6b3fa0}
.chips{display:flex;flex-wrap:wrap;gap:6px;margin:8px 0 0;padding:0}
.chips li{list-style:none;background:var(--code);border:1px solid var(--line);border-radius:12px;
padding:0 8px;font-size:12.5px}
.chips b{font-weight:600;color:var(--muted)}
.error{background:var(--errbg);color:var(--err);border:1px solid #f1aca5;border-radius:6px;
padding:6px 10px;margin:8px 0}
.error>b{display:block}
.cardwarn{background:var(--warnbg);color:var(--warn);border-radius:6px;padding:4px 10px 4px 26px;
margin:8px 0}
.field{margin:8px 0}
.field>b{color:var(--muted);font-weight:600;margin-right:6px}
.text{white-space:pre-wrap;word-break:break-word;margin:0;font:inherit}
.mono,.text.mono{font:12.5px/1.45 ui-monospace,SFMono-Regular,Menlo,Consolas,monospace}
pre.text,.field .text{background:var(--code);border:1px solid var(--line);border-radius:6px;
padding:6px 8px}
details.more>summary{cursor:pointer;color:#1a5fb4;font-size:12.5px;list-style:none;margin:2px 0}
details.more>summary::before{content:"▸ "}
details.more[open]>summary::before{content:"▾ "}
details.more[open]>summary .closed{display:none}
details.more:not([open])>summary .opened{display:none}
.omitted{color:var(--muted);font-style:italic}
details.block{margin:8px 0}
details.block>summary{cursor:pointer;color:var(--muted);font-weight:600}
.turns{margin-top:8px;display:flex;flex-direction:column;gap:6px}
.sep{color:var(--muted);font-size:12px;text-transform:uppercase;letter-spacing:.05em;
border-top:1px dashed var(--line);padding-top:4px;margin-top:4px}
.msg{border:1px solid var(--line);border-left-width:4px;border-radius:6px;padding:6px 10px;
background:#fff}
.msg .role{font-size:11.5px;font-weight:700;text-transform:uppercase;letter-spacing:.05em;
margin-bottom:3px}
.msg .role small{font-weight:400;text-transform:none;letter-spacing:0;color:var(--muted);
margin-left:6px}
.msg.system{border-left-color:#8d96a3;background:#fafbfc}.msg.system .role{color:#5f6b7a}
.msg.developer{border-left-color:#8d96a3;background:#fafbfc}.msg.developer .role{color:#5f6b7a}
.msg.user{border-left-color:#3b82f6}.msg.user .role{color:#1d4ed8}
.msg.assistant{border-left-color:#16a34a;background:#f7fcf8}.msg.assistant .role{color:#15803d}
.msg.tool{border-left-color:#d97706;background:#fffaf2}.msg.tool .role{color:#b45309}
.msg.other{border-left-color:#a855f7}.msg.other .role{color:#7e22ce}
.parts{display:flex;flex-direction:column;gap:6px}
.images{display:flex;flex-wrap:wrap;gap:8px;align-items:flex-start}
.thumb{display:inline-block;border:1px solid var(--line);border-radius:4px;line-height:0;
background:repeating-conic-gradient(#eee 0 25%,#fff 0 50%) 0 0/16px 16px}
.img{display:inline-block;background-size:contain;background-repeat:no-repeat;
background-position:center}
.img.pix{image-rendering:pixelated}
.img-missing,.img-remote,.vid-missing,.vid-remote{display:inline-flex;flex-direction:column;justify-content:center;gap:2px;
min-width:160px;min-height:90px;padding:8px;border:2px dashed #d0a14a;border-radius:6px;
background:var(--warnbg);color:var(--warn);font-size:12px;word-break:break-all;max-width:320px}
.img-remote,.vid-remote{border-color:#9aa5b4;background:#f3f5f8;color:var(--muted)}
.video{display:inline-flex;flex-direction:column;gap:4px;margin:0;padding:6px;
border:1px solid var(--line);border-radius:6px;background:#fafbfc;max-width:100%}
.video .strip{display:flex;flex-wrap:wrap;gap:4px;align-items:flex-start}
.video figcaption{font-size:12px;color:var(--muted)}
.video figcaption b{color:var(--fg);font-weight:600}
.video a.play{margin-left:6px;font-weight:600;color:#1a5fb4;text-decoration:none;white-space:nowrap}
.lightbox video{position:relative;max-width:94vw;max-height:80vh;background:#000;
min-width:min(480px,94vw)}
.toolcall{border:1px solid #c7e3cf;background:#fff;border-radius:6px;padding:4px 8px}
.toolcall .fn{font-weight:700;font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace}
.toolcall .id{color:var(--muted);font-size:12px;margin-left:6px}
.toolcall .bad{color:var(--err);font-size:12px;margin-left:6px}
details.reasoning{border:1px dashed #b9c2ce;border-radius:6px;padding:3px 8px;background:#fbfbfd}
details.reasoning>summary{cursor:pointer;color:var(--muted);font-style:italic}
.empty{color:var(--muted);font-style:italic}
.lightbox{display:none;position:fixed;inset:0;z-index:50;background:rgba(15,20,30,.86);
align-items:center;justify-content:center;flex-direction:column;gap:8px}
.lightbox:target,.lightbox.open{display:flex}
.lightbox .lb-close{position:absolute;inset:0;cursor:zoom-out}
.lightbox .img{position:relative;background-color:#fff;pointer-events:none}
.lightbox .cap{position:relative;color:#dfe5ee;font-size:12px;pointer-events:none}
#selftest{display:none}
img.img{vertical-align:top}
.lightbox img.img{height:auto}
.pager{display:flex;flex-wrap:wrap;gap:6px;align-items:center;margin:12px 0}
.pager a,.pager b,.pager .off{padding:1px 8px;border:1px solid var(--line);border-radius:6px;
background:var(--card);text-decoration:none;color:#1a5fb4}
.pager b{background:#1a5fb4;color:#fff;border-color:#1a5fb4}
.pager .off{color:#aab2bf}
.pager .gap{color:var(--muted)}
.pager .where{margin-left:auto;color:var(--muted)}
.pager .where a{border:0;padding:0;background:none}
.panel.pagelist{max-height:360px;overflow:auto}
.paged .card{content-visibility:auto;contain-intrinsic-size:auto 900px}
table.pagelist td{color:var(--muted)}
"""

_JS = r"""
(function () {
  "use strict";
  var list = document.getElementById("cards");
  var cards = Array.prototype.slice.call(document.querySelectorAll("#cards > article.card"));
  var controls = document.getElementById("controls");
  var sortSel = document.getElementById("sort");
  var errOnly = document.getElementById("errors-only");
  var exFilter = document.getElementById("example-filter");
  var countEl = document.getElementById("shown-count");
  controls.hidden = false;

  function reward(c) {
    var v = c.getAttribute("data-reward");
    return v === "" ? null : parseFloat(v);
  }
  function order(c) { return +c.getAttribute("data-order"); }
  function sortCards(mode) {
    var s = cards.slice();
    if (mode === "asc" || mode === "desc") {
      var sign = mode === "asc" ? 1 : -1;
      s.sort(function (a, b) {
        var x = reward(a), y = reward(b);
        if (x === null || y === null) {
          if (x === null && y === null) return order(a) - order(b);
          return x === null ? 1 : -1;  // no / non-finite reward: always last
        }
        return sign * (x - y) || order(a) - order(b);
      });
    } else {
      s.sort(function (a, b) { return order(a) - order(b); });
    }
    s.forEach(function (c) { list.appendChild(c); });
  }
  function filterCards() {
    var ids = exFilter.value.split(",").map(function (x) { return x.trim(); })
      .filter(function (x) { return x !== ""; });
    var shown = 0;
    cards.forEach(function (c) {
      var ok = (!errOnly.checked || c.hasAttribute("data-error")) &&
        (ids.length === 0 || ids.indexOf(c.getAttribute("data-example")) >= 0);
      c.hidden = !ok;
      if (ok) shown++;
    });
    countEl.textContent = shown + " of " + cards.length + " rollouts shown";
  }
  sortSel.addEventListener("change", function () { sortCards(sortSel.value); });
  errOnly.addEventListener("change", filterCards);
  exFilter.addEventListener("input", filterCards);
  filterCards();

  // lightbox: open without touching the URL (the :target fallback works without JS)
  function closeAll() {
    document.querySelectorAll(".lightbox.open").forEach(function (b) { b.classList.remove("open"); });
    document.querySelectorAll(".lightbox video").forEach(function (v) { v.pause(); });
  }
  document.addEventListener("click", function (e) {
    var a = e.target.closest("a.thumb, a.play");
    if (a) {
      var box = document.getElementById(a.getAttribute("href").slice(1));
      if (box) { e.preventDefault(); closeAll(); box.classList.add("open"); }
      return;
    }
    if (e.target.closest(".lightbox video")) return;  // the player's own controls
    if (e.target.closest(".lightbox.open")) { e.preventDefault(); closeAll(); }
  });
  document.addEventListener("keydown", function (e) { if (e.key === "Escape") closeAll(); });

  // #selftest: decode every image shown in the cards, exercise sort and filter, report
  if (location.hash !== "#selftest") return;
  var decoded = {};
  function decodes(url) {
    if (!(url in decoded)) {
      decoded[url] = new Promise(function (resolve) {
        var im = new Image();
        im.onload = function () { resolve(im.naturalWidth); };
        im.onerror = function () { resolve(0); };
        im.src = url;
      });
    }
    return decoded[url];
  }
  function background(el) {  // an embedded image: a CSS background; a linked one: <img>
    if (el.tagName === "IMG") {  // the page's own element, loaded now rather than in view
      el.loading = "eager";
      return el.decode().then(function () { return el.naturalWidth; }, function () { return 0; });
    }
    var m = /^url\("?(.*?)"?\)$/.exec(getComputedStyle(el).backgroundImage);
    return m ? decodes(m[1]) : Promise.resolve(0);
  }
  var lazy = document.querySelectorAll("#cards img[loading=lazy]").length;
  var occ = Array.prototype.slice.call(document.querySelectorAll("#cards .imgocc"));
  var jobs = occ.filter(function (el) { return el.hasAttribute("data-asset"); }).map(background);
  var vframes = Array.prototype.slice.call(document.querySelectorAll("#cards .vframe"));
  var players = Array.prototype.slice.call(document.querySelectorAll(".lightbox video"));
  function plays(v) {  // its metadata loads: the browser reads the embedded file
    return new Promise(function (resolve) {
      if (v.readyState >= 1) { resolve(v.videoWidth); return; }
      v.addEventListener("loadedmetadata", function () { resolve(v.videoWidth); });
      v.addEventListener("error", function () { resolve(0); });
      setTimeout(function () { resolve(0); }, 5000);
      v.load();
    });
  }
  Promise.all([Promise.all(jobs), Promise.all(vframes.map(background)),
               Promise.all(players.map(plays))]).then(function (all) {
    var widths = all[0];
    function ids() { return cards.filter(function (c) { return !c.hidden; })
      .map(function (c) { return c.id; }); }
    function domOrder() { return Array.prototype.map.call(list.children, function (c) { return c.id; }); }
    sortCards("desc"); var desc = domOrder();
    sortCards("asc"); var asc = domOrder();
    sortCards("file");
    errOnly.checked = true; filterCards(); var errors = ids();
    errOnly.checked = false; filterCards();
    var out = document.createElement("pre");
    out.id = "selftest";
    out.textContent = JSON.stringify({
      images: occ.length,
      loaded: widths.filter(function (w) { return w > 0; }).length,
      missing: document.querySelectorAll("#cards .img-missing").length,
      remote: document.querySelectorAll("#cards .img-remote").length,
      videos: document.querySelectorAll("#cards .vidocc").length,
      videos_missing: document.querySelectorAll("#cards .vid-missing").length,
      video_frames: vframes.length,
      video_frames_loaded: all[1].filter(function (w) { return w > 0; }).length,
      players: players.length,
      players_loaded: all[2].filter(function (w) { return w > 0; }).length,
      cards: cards.length,
      lazy: lazy,
      sorted_desc: desc, sorted_asc: asc, errors_only: errors
    });
    document.body.appendChild(out);
  });
})();
"""

_SCRIPT_SRC = f"'sha256-{base64.b64encode(hashlib.sha256(_JS.encode()).digest()).decode()}'"
_CSP = (
    "default-src 'none'; img-src data:; media-src data:; style-src 'unsafe-inline'; "
    f"script-src {_SCRIPT_SRC}; base-uri 'none'; form-action 'none'"
)
_PAGED_CSP = (
    "default-src 'none'; img-src 'self'; media-src 'self'; style-src 'unsafe-inline'; "
    f"script-src {_SCRIPT_SRC}; base-uri 'none'; form-action 'none'"
)

_TEMPLATE = r"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{{ csp }}">
<meta name="referrer" content="no-referrer">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="generator" content="vf-mm view">
<title>{{ title }} — vf-mm report</title>
<style>{{ css }}</style>
<style id="asset-css">
{{ asset_css }}
</style>
</head>
<body{% if paged %} class="paged"{% endif %}>
{%- macro text(t, cls="") -%}
<div class="text {{ cls }}">{{ t.head }}{% if t.tail %}<details class="more"><summary><span class="closed">show more ({{ "{:,}".format(t.tail|length) }} more characters)</span><span class="opened">show less</span></summary>{{ t.tail }}</details>{% endif %}{% if t.omitted %}<span class="omitted"> [… {{ "{:,}".format(t.omitted) }} more characters not included in this report]</span>{% endif %}</div>
{%- endmacro -%}
{%- macro message(m) -%}
<div class="msg {{ m.role_class }}">
<div class="role">{{ m.role }}{% if m.turn %}<small>turn {{ m.turn }}</small>{% endif %}{% if m.name %}<small>{{ m.name }}</small>{% endif %}{% if m.tool_call_id %}<small>↩ {{ m.tool_call_id }}</small>{% endif %}</div>
<div class="parts">
{% if m.reasoning %}<details class="reasoning"><summary>reasoning ({{ "{:,}".format(m.reasoning.total) }} characters)</summary>{{ text(m.reasoning) }}</details>{% endif %}
{% set ns = namespace(open=false) %}
{% for p in m.parts %}
{% if p.kind == "image" %}{% if not ns.open %}<div class="images">{% set ns.open = true %}{% endif %}
{% if p.type == "asset" %}<a class="thumb" href="#view-{{ p.asset.cls }}" title="{{ p.asset.width }}&times;{{ p.asset.height }}: click to enlarge">{% if p.asset.src %}<img class="img imgocc{% if p.pixelated %} pix{% endif %}" data-asset="{{ p.asset.cls }}" src="{{ p.asset.src }}" loading="lazy" decoding="async" alt="image {{ p.asset.width }}&times;{{ p.asset.height }}" width="{{ p.w }}" height="{{ p.h }}">{% else %}<span class="img imgocc {{ p.asset.cls }}{% if p.pixelated %} pix{% endif %}" data-asset="{{ p.asset.cls }}" role="img" aria-label="image {{ p.asset.width }}&times;{{ p.asset.height }}" style="width:{{ p.w }}px;height:{{ p.h }}px"></span>{% endif %}</a>
{% elif p.type == "remote" %}<span class="imgocc img-remote"><b>remote image (not embedded)</b><a href="{{ p.url }}" rel="noreferrer noopener" target="_blank">{{ p.url }}</a></span>
{% else %}<span class="imgocc img-missing" role="img" aria-label="missing image"><b>⚠ image unavailable</b><span>{{ p.ref }}</span><span>{{ p.reason }}</span></span>
{% endif %}
{% elif p.kind == "video" %}{% if ns.open %}</div>{% set ns.open = false %}{% endif %}
{% if p.type == "asset" %}{% set v = p.video %}<figure class="video vidocc" data-video="{{ v.cls }}"><div class="strip">{% for f in v.frames %}<a class="thumb" href="#view-{{ f.asset.cls }}" title="frame {{ f.index + 1 }} of {{ v.num_frames }}: click to enlarge">{% if f.asset.src %}<img class="img vframe{% if f.pixelated %} pix{% endif %}" data-asset="{{ f.asset.cls }}" src="{{ f.asset.src }}" loading="lazy" decoding="async" alt="frame {{ f.index + 1 }} of {{ v.num_frames }}" width="{{ f.w }}" height="{{ f.h }}">{% else %}<span class="img vframe {{ f.asset.cls }}{% if f.pixelated %} pix{% endif %}" data-asset="{{ f.asset.cls }}" role="img" aria-label="frame {{ f.index + 1 }} of {{ v.num_frames }}" style="width:{{ f.w }}px;height:{{ f.h }}px"></span>{% endif %}</a>{% endfor %}</div>
<figcaption><b>video</b> · {{ p.caption }}{% if p.options %} · sampled with {{ p.options }}{% endif %}{% if v.mime %}<a class="play" href="#play-{{ v.cls }}">▶ play</a>{% endif %}</figcaption></figure>
{% elif p.type == "remote" %}<span class="vidocc vid-remote"><b>remote video (not embedded)</b><a href="{{ p.url }}" rel="noreferrer noopener" target="_blank">{{ p.url }}</a>{% if p.options %}<span>sampled with {{ p.options }}</span>{% endif %}</span>
{% else %}<span class="vidocc vid-missing" role="img" aria-label="missing video"><b>⚠ video unavailable</b><span>{{ p.ref }}</span><span>{{ p.reason }}</span></span>
{% endif %}
{% else %}{% if ns.open %}</div>{% set ns.open = false %}{% endif %}
{% if p.kind == "text" %}{{ text(p.text) }}{% else %}{{ text(p.text, "mono") }}{% endif %}
{% endif %}
{% endfor %}
{% if ns.open %}</div>{% endif %}
{% for c in m.tool_calls %}
<div class="toolcall"><span class="fn">{{ c.name }}</span>{% if c.id %}<span class="id">{{ c.id }}</span>{% endif %}{% if c.invalid %}<span class="bad">arguments are not valid JSON</span>{% endif %}{{ text(c.args, "mono") }}</div>
{% endfor %}
{% if not m.parts and not m.tool_calls and not m.reasoning %}<span class="empty">(empty)</span>{% endif %}
</div>
</div>
{%- endmacro %}
{%- macro nav(pg) -%}
<nav class="pager" aria-label="pages">
{% if pg.prev %}<a class="first" href="{{ pg.first_url }}">« first</a><a class="prev" href="{{ pg.prev }}" rel="prev">&lsaquo; prev</a>{% else %}<span class="off">« first</span><span class="off">&lsaquo; prev</span>{% endif %}
{% for n, url in pg.window %}{% if not url %}<span class="gap">…</span>{% elif n == pg.number %}<b aria-current="page">{{ n }}</b>{% else %}<a class="num" href="{{ url }}">{{ n }}</a>{% endif %}{% endfor %}
{% if pg.next %}<a class="next" href="{{ pg.next }}" rel="next">next &rsaquo;</a><a class="last" href="{{ pg.last_url }}">last »</a>{% else %}<span class="off">next &rsaquo;</span><span class="off">last »</span>{% endif %}
<span class="where">page {{ pg.number }} of {{ pg.count }} · rollouts #{{ pg.first }}&ndash;#{{ pg.last }} of {{ "{:,}".format(total) }} · <a class="all" href="{{ pg.index_url }}#pages">summary &amp; all pages</a></span>
</nav>
{%- endmacro %}
<main>
<h1>{{ title }}</h1>
<div class="sub">{{ outdir }}{% if interrupted %} <span class="badge interrupted">unfinished run</span>{% endif %}</div>
{% if summary %}
<div class="panels">
<section class="panel"><h3>Run</h3>
{% if config_rows %}<table class="kv">{% for k, v in config_rows %}<tr><th>{{ k }}</th><td>{% if v is mapping %}{{ text(v, "mono") }}{% else %}{{ v }}{% endif %}</td></tr>{% endfor %}</table>
{% else %}<p class="empty">no run config (metadata.json missing or empty)</p>{% endif %}
</section>
<section class="panel"><h3>Results{% if results_computed %} <small>(computed from results.jsonl)</small>{% endif %}</h3>
{% if result_rows %}<table class="kv" id="aggregates">{% for k, v in result_rows %}<tr><th>{{ k }}</th><td class="num">{{ v }}</td></tr>{% endfor %}</table>
{% else %}<p class="empty">no aggregates</p>{% endif %}
{% if metric_rows %}<h3 style="margin-top:10px">Metrics</h3><table class="kv" id="metrics"><tr><th>metric</th><th>mean</th><th>std</th></tr>{% for n, mean, std in metric_rows %}<tr><td>{{ n }}</td><td class="num">{{ mean }}</td><td class="num">{{ std }}</td></tr>{% endfor %}</table>{% endif %}
</section>
{% if pages %}<section class="panel pagelist" id="pages"><h3>Pages <small>({{ pages|length }}, {{ page_size }} rollouts each)</small></h3><table class="kv pagelist">{% for pg in pages %}<tr><th><a href="{{ pg.url }}">page {{ pg.number }}</a></th><td>#{{ pg.first }}&ndash;#{{ pg.last }} · example {{ pg.first_example }}{% if pg.last_example != pg.first_example %} &ndash; {{ pg.last_example }}{% endif %}{% if pg.errors %} · {{ pg.errors|plural("error") }}{% endif %}{% if pg.flagged %} · {{ pg.flagged }} with warnings{% endif %}</td></tr>{% endfor %}</table></section>{% endif %}
</div>
{% endif %}
{% if warnings %}<ul class="warnings" id="warnings">{% for w in warnings %}<li>{{ w }}</li>{% endfor %}</ul>{% endif %}
{% if pager %}{{ nav(pager) }}{% endif %}
<div class="controls" id="controls" hidden>
<label>sort <select id="sort"><option value="file">file order</option><option value="desc">reward: high → low</option><option value="asc">reward: low → high</option></select></label>
<label><input type="checkbox" id="errors-only"> errors only</label>
<label>example id <input type="text" id="example-filter" placeholder="e.g. 3, 7"></label>
<span class="count" id="shown-count"></span>
</div>
<div id="cards">
{% for c in cards %}
<article class="card{% if c.error %} has-error{% endif %}" id="{{ c.dom_id }}" data-order="{{ c.order }}" data-reward="{{ c.reward.sort }}" data-example="{{ c.example_id }}"{% if c.error %} data-error{% endif %}>
<header><span class="reward {{ c.reward.class }}"{% if c.reward.style %} style="{{ c.reward.style }}"{% endif %} title="reward">{{ c.reward.text }}</span>
<h2>example {{ c.example_id }}{% if c.rollout_index %} · rollout {{ c.rollout_index }}{% endif %}</h2>
<span class="meta">{% if c.num_turns %}{{ c.num_turns|plural("turn") }}{% endif %}{% if c.tokens %} · {{ c.tokens }} tokens{% endif %}{% if c.images %} · {{ c.images|plural("image") }}{% endif %}{% if c.videos %} · {{ c.videos|plural("video") }}{% endif %}</span>
<a class="anchor" href="#{{ c.dom_id }}">#{{ c.order }}</a></header>
{% if c.metrics %}<ul class="chips">{% for k, v in c.metrics %}<li><b>{{ k }}</b> {{ v }}</li>{% endfor %}</ul>{% endif %}
{% if c.error %}<div class="error"><b>error</b>{{ text(c.error, "mono") }}</div>{% endif %}
{% if c.warnings %}<ul class="cardwarn">{% for w in c.warnings %}<li>{{ w }}</li>{% endfor %}</ul>{% endif %}
{% if c.answer %}<div class="field"><b>answer</b>{{ text(c.answer, "mono") }}</div>{% endif %}
{% if c.info or c.timing %}<details class="block"><summary>info{% if c.timing %} &amp; timing{% endif %}</summary>
{% if c.timing %}<ul class="chips">{% for k, v in c.timing %}<li><b>{{ k }}</b> {{ v }}</li>{% endfor %}</ul>{% endif %}
{% if c.info %}<div class="field">{{ text(c.info, "mono") }}</div>{% endif %}
</details>{% endif %}
<div class="turns">
{% if c.prompt %}<details class="block" open><summary>prompt ({{ c.prompt|length|plural("message") }})</summary><div class="turns">
{% for m in c.prompt %}{{ message(m) }}
{% endfor %}</div></details>{% endif %}
<div class="sep">completion</div>
{% for m in c.completion %}{{ message(m) }}
{% else %}<p class="empty">(no completion)</p>
{% endfor %}
</div>
</article>
{% else %}
<p class="empty" id="no-rollouts">No rollouts{% if total %} shown{% else %} in results.jsonl{% endif %}.</p>
{% endfor %}
</div>
{% if pager %}{{ nav(pager) }}{% endif %}
</main>
{% for a in assets %}
<div class="lightbox" id="view-{{ a.cls }}" role="dialog" aria-label="image {{ a.width }}&times;{{ a.height }}"><a class="lb-close" href="#close" aria-label="close"></a>{% if a.src %}<img class="img{% if a.full_pixelated %} pix{% endif %}" src="{{ a.src }}" loading="lazy" decoding="async" alt="image {{ a.width }}&times;{{ a.height }}" style="{{ a.full_style }}">{% else %}<span class="img {{ a.cls }}{% if a.full_pixelated %} pix{% endif %}" style="{{ a.full_style }}"></span>{% endif %}<div class="cap">{{ a.width }}&times;{{ a.height }} · {{ a.mime }} · {% if a.src %}{{ a.src }}{% else %}sha256 {{ a.digest }}…{% endif %} · click or Esc to close</div></div>
{% endfor %}
{% for v in videos if v.mime %}
<div class="lightbox" id="play-{{ v.cls }}" role="dialog" aria-label="video {{ v.width }}&times;{{ v.height }}"><a class="lb-close" href="#close" aria-label="close"></a>{% if v.src %}<video controls preload="none" src="{{ v.src }}"></video>{% else %}<video controls preload="metadata" src="data:{{ v.mime }};base64,{{ v.b64 }}"></video>{% endif %}<div class="cap">{{ v.num_frames }} frames · {{ v.rate_text }} · {{ v.width }}&times;{{ v.height }} · {{ v.mime }} · sha256 {{ v.digest }}… · click outside or Esc to close</div></div>
{% endfor %}
<script>{{ js }}</script>
</body>
</html>
"""


@functools.cache
def _template() -> jinja2.Template:
    env = jinja2.Environment(
        autoescape=True, undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True
    )
    env.filters["plural"] = _plural
    return env.from_string(_TEMPLATE)
