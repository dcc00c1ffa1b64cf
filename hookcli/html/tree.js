// hookcli's page script: the report's rows as a tree table, built from the embedded JSON.
// Every text goes in through textContent, never as markup. Rows are built when first shown
// (a folded 7B model has a few dozen rows on screen, not thousands).
(function () {
  "use strict";

  function readJSON(id) {
    var el = document.getElementById(id);
    return el ? JSON.parse(el.textContent) : null;
  }
  var report = readJSON("hookcli-report");
  var page = readJSON("hookcli-page");
  var NONFINITE = { nan: NaN, inf: Infinity, "-inf": -Infinity };

  // -- formatting ----------------------------------------------------------------------
  function fmtNumber(v) {
    if (Number.isInteger(v)) return v.toLocaleString("en-US");
    var a = Math.abs(v);
    if (a === 0) return "0";
    if (a >= 1e-3 && a < 1e5) return String(Number(v.toPrecision(4)));
    return v.toExponential(3);
  }
  function fmtBytes(n) {
    var units = [["TiB", 1099511627776], ["GiB", 1073741824], ["MiB", 1048576], ["KiB", 1024]];
    for (var i = 0; i < units.length; i++) {
      if (Math.abs(n) >= units[i][1]) return (n / units[i][1]).toFixed(2) + " " + units[i][0];
    }
    return n + " B";
  }
  function isShape(v) {
    return Array.isArray(v) && v.every(function (d) { return typeof d === "number"; });
  }
  function fmtShape(s) { return "[" + s.join(", ") + "]"; }
  // [text, css class] of one cell
  // the columns the table shows as a percentage of a fraction (0.25 -> 25.0%)
  var PERCENT = {};
  (page.percent || []).forEach(function (k) { PERCENT[k] = true; });
  function cellText(v, key) {
    if (v === null || v === undefined) return ["-", "none"];
    if (typeof v === "boolean") return [v ? "yes" : "no", ""];
    if (typeof v === "number" && PERCENT[key]) return [(100 * v).toFixed(1) + "%", ""];
    if (typeof v === "number") {
      if (/bytes$/.test(key) && Number.isInteger(v)) return [fmtBytes(v), ""];
      return [fmtNumber(v), ""];
    }
    if (typeof v === "string") return [v, v in NONFINITE ? "nonfinite" : ""];
    if (Array.isArray(v)) {
      if (!v.length) return ["-", "none"];
      if (v.every(isShape) && v.length) {
        var shown = v.slice(0, 3).map(fmtShape).join(", ");
        return [v.length > 3 ? shown + " (+" + (v.length - 3) + ")" : shown, ""];
      }
      if (v.every(function (x) { return x === null || typeof x !== "object"; })) {
        return [v.map(function (x) { return cellText(x, key)[0]; }).join(", "), ""];
      }
    }
    return [JSON.stringify(v), ""];
  }
  function isNumeric(v) { return typeof v === "number" || (typeof v === "string" && v in NONFINITE); }
  function sortValue(v) {
    if (typeof v === "number") return v;
    if (typeof v === "string" && v in NONFINITE) return NONFINITE[v];
    if (typeof v === "boolean") return v ? 1 : 0;
    if (v === null || v === undefined) return null;
    if (typeof v === "string") return v.toLowerCase();
    return JSON.stringify(v);
  }
  function compare(a, b) {
    // null and NaN last whatever the direction is handled by the caller
    if (typeof a === "number" && typeof b === "number") return a - b;
    a = String(a); b = String(b);
    return a < b ? -1 : a > b ? 1 : 0;
  }
  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  }
  function rowLabel(row) {
    var name = row.name ? row.name : "(root)";
    return row.call ? name + "#" + row.call : name;
  }

  // -- which rows are marked ---------------------------------------------------------
  var failed = new Set();
  (report.checks || []).forEach(function (c) {
    if (!c.passed) (c.layers || []).forEach(function (l) { failed.add(l); });
  });
  var origin = page.origin;

  // -- one table of rows (the primary list: a tree; the others: flat) -----------------
  function keysOf(rows) {
    var keys = [];
    var seen = new Set();
    rows.forEach(function (r) {
      if (r && typeof r === "object") {
        Object.keys(r).forEach(function (k) { if (!seen.has(k)) { seen.add(k); keys.push(k); } });
      }
    });
    return keys;
  }

  function RowTable(table, rows, opts) {
    this.table = table;
    this.rows = rows;
    this.tree = opts.tree; // "calls" | "names" | null
    this.preferred = opts.columns || [];
    this.allColumns = false;
    this.sortKey = null;
    this.sortDir = 1;
    this.query = "";
    this.nodes = rows.map(function (row, i) {
      return { row: row, i: i, parent: null, children: [], depth: 0, open: false, tr: null, label: "" };
    });
    this.build();
    this.keys = keysOf(rows);
  }

  RowTable.prototype.build = function () {
    var nodes = this.nodes;
    var roots = [];
    if (this.tree === "calls") {
      var stack = [];
      nodes.forEach(function (n) {
        var d = typeof n.row.depth === "number" ? n.row.depth : 0;
        while (stack.length && stack[stack.length - 1].row.depth >= d) stack.pop();
        if (stack.length) { n.parent = stack[stack.length - 1]; n.parent.children.push(n); }
        else roots.push(n);
        stack.push(n);
      });
    } else if (this.tree === "names") {
      var byName = new Map();
      nodes.forEach(function (n) {
        if (typeof n.row.name === "string" && !byName.has(n.row.name)) byName.set(n.row.name, n);
      });
      nodes.forEach(function (n) {
        var name = n.row.name;
        var parent = null;
        if (typeof name === "string" && name !== "") {
          var p = name;
          while (p.indexOf(".") >= 0 && !parent) {
            p = p.slice(0, p.lastIndexOf("."));
            parent = byName.get(p) || null;
          }
          if (!parent && byName.has("") && byName.get("") !== n) parent = byName.get("");
        }
        if (parent) { n.parent = parent; parent.children.push(n); } else roots.push(n);
      });
    } else {
      roots = nodes.slice();
    }
    function setDepth(n, d) {
      n.depth = d;
      n.children.forEach(function (c) { setDepth(c, d + 1); });
    }
    roots.forEach(function (r) { setDepth(r, 0); });
    this.roots = roots;
    nodes.forEach(function (n) {
      n.label = rowLabel(n.row);
      n.search = ((typeof n.row.name === "string" ? n.row.name : "") + "\u0000" +
        (n.row.type || "") + "\u0000" + (n.row.module || "") + "\u0000" + n.label).toLowerCase();
    });
  };

  RowTable.prototype.columns = function () {
    var treeKeys = this.tree ? ["name", "call", "depth"] : [];
    if (!this.allColumns && this.preferred.length) return this.preferred;
    return this.keys.filter(function (k) { return treeKeys.indexOf(k) < 0; })
      .map(function (k) { return [k, k]; });
  };

  RowTable.prototype.header = function () {
    var self = this;
    var thead = this.table.tHead;
    var tr = el("tr");
    var cols = this.columns();
    if (this.tree) {
      var th = el("th", "", "name");
      th.dataset.key = "name";
      tr.appendChild(th);
    }
    cols.forEach(function (c) {
      var th = el("th", "", c[1]);
      th.dataset.key = c[0];
      th.title = c[0];
      tr.appendChild(th);
    });
    Array.prototype.forEach.call(tr.children, function (th) {
      if (th.dataset.key === self.sortKey) th.setAttribute("aria-sort", self.sortDir > 0 ? "ascending" : "descending");
      th.addEventListener("click", function () { self.sortBy(th.dataset.key); });
    });
    thead.replaceChildren(tr);
    this.numeric = cols.map(function (c) {
      return self.rows.some(function (r) { return isNumeric(r[c[0]]); });
    });
  };

  RowTable.prototype.makeRow = function (n) {
    var tr = el("tr");
    var row = n.row;
    tr.dataset.i = String(n.i);
    if (this.tree) {
      var td = el("td", "tree");
      td.style.paddingLeft = (0.3 + 1.2 * n.depth) + "em";
      var tog = el("button", "tog" + (n.children.length ? "" : " leaf"), n.open ? "\u25BE" : "\u25B8");
      tog.type = "button";
      tog.setAttribute("aria-label", "expand or collapse");
      if (n.children.length) tog.setAttribute("aria-expanded", String(n.open));
      td.appendChild(tog);
      var name = typeof row.name === "string" ? (row.name || "(root)") : n.label;
      td.appendChild(el("span", "nm", name));
      if (row.call) td.appendChild(el("span", "call", " #" + row.call));
      if (Array.isArray(row.shared_with) && row.shared_with.length) {
        var t = el("span", "tag tied", "tied");
        t.title = "shares a tensor with " + row.shared_with.join(", ");
        td.appendChild(t);
      }
      if (origin !== null && origin !== undefined && n.label === origin) {
        td.appendChild(el("span", "tag origin", "first NaN/Inf"));
        tr.classList.add("origin");
      }
      if (failed.has(n.label)) { td.appendChild(el("span", "tag fail", "failed check")); tr.classList.add("failed"); }
      if (row.called === false) { td.appendChild(el("span", "tag idle", "not called")); tr.classList.add("uncalled"); }
      tr.appendChild(td);
    }
    var cols = this.columns();
    for (var c = 0; c < cols.length; c++) {
      var key = cols[c][0];
      var v = row[key];
      var ct = cellText(v, key);
      var td2 = el("td", this.numeric[c] ? "num" : "");
      td2.dataset.k = key;
      var span = el("span", ct[1], ct[0]);
      if (typeof v === "number") span.title = String(v);
      else if (Array.isArray(v) || (v && typeof v === "object")) span.title = JSON.stringify(v);
      if (!this.tree && key === "name" && Array.isArray(row.shared_with) && row.shared_with.length) {
        td2.appendChild(span);
        var tt = el("span", "tag tied", "tied");
        tt.title = "shares a tensor with " + row.shared_with.join(", ");
        td2.appendChild(tt);
      } else {
        td2.appendChild(span);
      }
      tr.appendChild(td2);
    }
    n.tr = tr;
    return tr;
  };

  RowTable.prototype.visible = function () {
    var out = [];
    var self = this;
    if (this.query) {
      var q = this.query;
      var keep = new Set();
      var hit = new Set();
      this.nodes.forEach(function (n) {
        if (n.search.indexOf(q) >= 0) {
          hit.add(n);
          for (var p = n; p && !keep.has(p); p = p.parent) keep.add(p);
        }
      });
      this.hits = hit.size;
      (function walk(list) {
        list.forEach(function (n) {
          if (!keep.has(n)) return;
          out.push(n);
          walk(self.ordered(n.children));
        });
      })(this.ordered(this.roots));
      this.hitSet = hit;
      return out;
    }
    this.hitSet = null;
    (function walk(list) {
      list.forEach(function (n) {
        out.push(n);
        if (n.open) walk(self.ordered(n.children));
      });
    })(this.ordered(this.roots));
    return out;
  };

  RowTable.prototype.ordered = function (list) {
    if (!this.sortKey) return list;
    var key = this.sortKey;
    var dir = this.sortDir;
    var keyed = list.map(function (n) {
      var v = key === "name" ? n.label.toLowerCase() : sortValue(n.row[key]);
      return [v, n];
    });
    keyed.sort(function (a, b) {
      var x = a[0], y = b[0];
      var xm = x === null || (typeof x === "number" && isNaN(x));
      var ym = y === null || (typeof y === "number" && isNaN(y));
      if (xm || ym) return xm && ym ? a[1].i - b[1].i : xm ? 1 : -1; // missing last
      var c = compare(x, y) * dir;
      return c !== 0 ? c : a[1].i - b[1].i;
    });
    return keyed.map(function (p) { return p[1]; });
  };

  RowTable.prototype.render = function () {
    var t0 = performance.now();
    var list = this.visible();
    var frag = document.createDocumentFragment();
    for (var i = 0; i < list.length; i++) {
      var n = list[i];
      var tr = n.tr || this.makeRow(n);
      if (this.tree) {
        var tog = tr.firstChild.firstChild;
        var open = this.hitSet ? true : n.open;
        if (n.children.length) {
          tog.textContent = open ? "\u25BE" : "\u25B8";
          tog.setAttribute("aria-expanded", String(open));
        }
      }
      tr.classList.toggle("match", !!(this.hitSet && this.hitSet.has(n)));
      frag.appendChild(tr);
    }
    this.table.tBodies[0].replaceChildren(frag);
    this.shown = list.length;
    if (this.onrender) this.onrender(list.length, performance.now() - t0);
  };

  RowTable.prototype.toggle = function (n) {
    if (this.hitSet) return; // while filtering the matches' ancestors stay open
    n.open = !n.open;
    this.render();
  };

  RowTable.prototype.expandTo = function (depth) {
    this.nodes.forEach(function (n) { n.open = n.depth < depth; });
    this.render();
  };

  RowTable.prototype.reveal = function (n) {
    for (var p = n.parent; p; p = p.parent) p.open = true;
  };

  RowTable.prototype.sortBy = function (key) {
    if (this.sortKey === key) this.sortDir = -this.sortDir;
    else { this.sortKey = key; this.sortDir = key === "name" ? 1 : -1; }
    this.reset();
  };

  RowTable.prototype.reset = function () {
    this.nodes.forEach(function (n) { n.tr = null; });
    this.header();
    this.render();
  };

  RowTable.prototype.bind = function () {
    var self = this;
    this.table.tBodies[0].addEventListener("click", function (ev) {
      var target = ev.target;
      if (!(target instanceof Element) || !target.classList.contains("tog")) return;
      var tr = target.closest("tr");
      if (tr) self.toggle(self.nodes[Number(tr.dataset.i)]);
    });
  };

  // the depth to open at first: as deep as keeps about 60 rows on screen, at least 1
  function firstDepth(t) {
    var counts = [];
    t.nodes.forEach(function (n) { counts[n.depth] = (counts[n.depth] || 0) + 1; });
    var total = 0;
    var depth = 0;
    for (var d = 0; d < counts.length; d++) {
      total += counts[d] || 0;
      if (total > 60 && d > 1) break;
      depth = d;
    }
    return depth; // rows at depth <= depth show: nodes with depth < depth are open
  }

  // -- the primary table -------------------------------------------------------------
  var primary = page.primary;
  var rows = report[primary] || [];
  var listInfo = page.lists[primary] || { tree: null };
  var title = document.getElementById("rows-title");
  title.textContent = primary === "layers" ? "Layers" : primary.charAt(0).toUpperCase() + primary.slice(1);
  var table = document.getElementById("tree");
  var tt = new RowTable(table, rows, { tree: listInfo.tree, columns: page.columns });
  var counter = document.getElementById("row-count");
  tt.onrender = function (shown) {
    counter.textContent = tt.query
      ? tt.hits + " of " + rows.length + " rows match (" + shown + " shown with their ancestors)"
      : shown + " of " + rows.length + " rows shown";
  };
  tt.bind();
  var depthInput = document.getElementById("depth");
  var start = firstDepth(tt);
  depthInput.value = String(start);
  tt.nodes.forEach(function (n) { n.open = n.depth < start; });
  var originNode = null;
  if (origin !== null && origin !== undefined) {
    originNode = tt.nodes.find(function (n) { return n.label === origin; }) || null;
    if (originNode) tt.reveal(originNode);
  }
  tt.header();
  var t0 = performance.now();
  tt.render();
  document.body.dataset.firstRenderMs = (performance.now() - t0).toFixed(1);
  if (!tt.tree) {
    ["depth", "expand-depth", "expand-all", "collapse-all"].forEach(function (id) {
      var e = document.getElementById(id);
      (e.closest("label") || e).hidden = true;
    });
  }

  var timer = null;
  document.getElementById("search").addEventListener("input", function (ev) {
    var value = ev.target.value.trim().toLowerCase();
    clearTimeout(timer);
    timer = setTimeout(function () { tt.query = value; tt.render(); }, 120);
  });
  document.getElementById("expand-depth").addEventListener("click", function () {
    var d = Math.max(0, parseInt(depthInput.value, 10) || 0);
    tt.expandTo(d);
  });
  document.getElementById("expand-all").addEventListener("click", function () { tt.expandTo(Infinity); });
  document.getElementById("collapse-all").addEventListener("click", function () { tt.expandTo(0); });
  document.getElementById("all-columns").addEventListener("change", function (ev) {
    tt.allColumns = ev.target.checked;
    tt.reset();
  });
  var goto = document.getElementById("goto-origin");
  if (goto) {
    goto.addEventListener("click", function (ev) {
      ev.preventDefault();
      if (!originNode) return;
      if (tt.query) { tt.query = ""; document.getElementById("search").value = ""; }
      tt.reveal(originNode);
      tt.render();
      originNode.tr.scrollIntoView({ block: "center" });
    });
  }

  // -- the other lists, flat, built when opened ----------------------------------------
  var listsBox = document.getElementById("lists");
  Object.keys(page.lists).forEach(function (name) {
    if (name === primary) return;
    var list = report[name] || [];
    if (!list.length) return;
    var details = el("details");
    details.dataset.list = name;
    details.appendChild(el("summary", "", name + " (" + list.length + ")"));
    var box = el("div", "scroll");
    var t = el("table", "rows");
    t.appendChild(el("thead"));
    t.appendChild(el("tbody"));
    box.appendChild(t);
    details.appendChild(box);
    details.addEventListener("toggle", function () {
      if (!details.open || details.dataset.built) return;
      details.dataset.built = "1";
      var rt = new RowTable(t, list, { tree: null, columns: [] });
      rt.bind();
      rt.header();
      rt.render();
    });
    listsBox.appendChild(details);
  });

  // -- widgets: diff's side-by-side ----------------------------------------------------
  function sideBySide(box) {
    var oldR = readJSON("hookcli-old");
    var newR = readJSON("hookcli-new");
    var align = page.diff || { lists: {} };
    if (!oldR || !newR) { box.appendChild(el("p", "muted", "The compared reports are not in this page.")); return; }
    var differs = new Map(); // where \0 item -> Set of top-level keys ("" for the whole row)
    (report.differences || []).forEach(function (d) {
      var id = d.where + "\u0000" + d.item;
      if (!differs.has(id)) differs.set(id, new Set());
      differs.get(id).add(d.key === "" ? "" : String(d.key).split(".")[0]);
    });
    function section(title, where, items, keys) {
      // items: [label, oldRow | undefined, newRow | undefined]
      var h = el("h3", "", title);
      box.appendChild(h);
      var wrap = el("div", "scroll");
      var t = el("table", "rows sbs");
      t.dataset.where = where;
      var head = el("tr");
      head.appendChild(el("th", "", "item"));
      keys.forEach(function (k) {
        head.appendChild(el("th", "old", k === "v" ? "old" : k + " (old)"));
        head.appendChild(el("th", "", k === "v" ? "new" : k + " (new)"));
      });
      var thead = el("thead");
      thead.appendChild(head);
      t.appendChild(thead);
      var tbody = el("tbody");
      items.forEach(function (it) {
        var tr = el("tr");
        tr.dataset.item = it[0];
        var marks = differs.get(where + "\u0000" + it[0]) || new Set();
        if (!it[1]) tr.classList.add("added");
        else if (!it[2]) tr.classList.add("removed");
        tr.appendChild(el("td", "", it[0]));
        keys.forEach(function (k) {
          var diff = marks.has(k);
          [it[1], it[2]].forEach(function (r, side) {
            var v = r ? r[k] : undefined;
            var ct = cellText(v, k);
            var td = el("td", (side === 0 ? "old" : "new") + (diff ? " differs" : ""), ct[0]);
            td.dataset.k = k;
            if (typeof v === "number") td.title = String(v);
            tr.appendChild(td);
          });
        });
        tbody.appendChild(tr);
      });
      t.appendChild(tbody);
      wrap.appendChild(t);
      box.appendChild(wrap);
    }
    function mapping(title, where, a, b) {
      var keys = keysOf([a || {}, b || {}]);
      if (!keys.length) return;
      var items = keys.map(function (k) { return [k, { v: (a || {})[k] }, { v: (b || {})[k] }]; });
      // a mapping's differences are keyed by its key (where = "totals" or "settings")
      var saved = differs;
      differs = new Map();
      saved.forEach(function (v, id) { differs.set(id, v); });
      (report.differences || []).forEach(function (d) {
        if (d.where === where) {
          var id = where + "\u0000" + String(d.key).split(".")[0];
          if (!differs.has(id)) differs.set(id, new Set());
          differs.get(id).add("v");
        }
      });
      section(title, where, items, ["v"]);
      differs = saved;
    }
    mapping("Settings", "settings", oldR.settings, newR.settings);
    mapping("Totals", "totals", oldR.totals, newR.totals);
    Object.keys(align.lists || {}).forEach(function (name) {
      var pairs = align.lists[name];
      var oldRows = oldR[name] || [];
      var newRows = newR[name] || [];
      var items = pairs.map(function (p) {
        return [p[0], p[1] === null ? null : oldRows[p[1]], p[2] === null ? null : newRows[p[2]]];
      });
      var diffKeys = new Set();
      (report.differences || []).forEach(function (d) {
        if (d.where === name && d.key) diffKeys.add(String(d.key).split(".")[0]);
      });
      var all = keysOf(oldRows.concat(newRows)).filter(function (k) {
        return ["name", "call", "depth", "seq"].indexOf(k) < 0;
      });
      var keys = all.filter(function (k) { return diffKeys.has(k); });
      if (!keys.length) keys = all.slice(0, 4);
      section(name + " (" + items.length + " rows; the columns that differ)", name, items, keys);
    });
  }
  Array.prototype.forEach.call(document.querySelectorAll("[data-widget]"), function (box) {
    if (box.dataset.widget === "side-by-side") sideBySide(box);
  });
  document.body.dataset.ready = "1";
})();
