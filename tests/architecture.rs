//! The crate's layering: the import graph between its folders must have no cycle.
//!
//! A folder (a *unit*) is a top-level module of `src/` (`src/X/` or `src/X.rs`); a folder of
//! `src/backends/` (`src/backends/cpu/`) is a unit of its own, `backends::cpu`. A file of unit
//! A that names a path `crate::B::...` (a `use` item, a group `use crate::{B::x, C::y}`, or a
//! path inline in code), or a `super::...` path that climbs into B, is an edge A -> B. Comments
//! and string literals are skipped; code under `#[cfg(test)]` counts too (a test that imports
//! upward closes a cycle as surely), and its edges are labelled `test code only` when nothing
//! else makes them.
//!
//! `cargo test --release --test architecture -- --nocapture` prints the graph and its layers.
//!
//! The scanner is a small hand-written lexer (identifiers, `::`, brackets; comments, strings,
//! chars and lifetimes skipped), not a Rust parser: enough for paths, which is all it reads.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// Edges tolerated on a cycle while the cycle is being removed: `("graph", "vec_ops")` lets
/// `graph -> vec_ops` stand. Each entry must still exist and still be on a cycle, so the list
/// can only shrink.
const KNOWN_CYCLES: &[(&str, &str)] = &[];

/// Folders of `src/` whose own folders are units (`backends::cpu`).
const SPLIT_FOLDERS: &[&str] = &["backends"];

/// The unit of `src/lib.rs` and of items named at the crate root.
const ROOT: &str = "crate";

// ---------------------------------------------------------------------------------------------
// The lexer

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    /// `::`
    PathSep,
    Sym(char),
}

#[derive(Debug, Clone)]
struct Token {
    tok: Tok,
    line: usize,
}

fn is_ident_start(c: char) -> bool {
    c.is_alphabetic() || c == '_'
}

fn is_ident_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// Tokens of `src` (identifiers, numbers as identifiers, `::`, single punctuation), with their
/// lines; comments, string/char literals and lifetimes leave nothing.
fn lex(src: &str) -> Vec<Token> {
    let c: Vec<char> = src.chars().collect();
    let at = |i: usize| c.get(i).copied().unwrap_or('\0');
    let mut out = Vec::new();
    let (mut i, mut line) = (0usize, 1usize);
    // Skips a quoted literal whose opening quote is at `i`; returns the index past its end.
    let skip_quoted = |mut i: usize, quote: char, line: &mut usize| -> usize {
        i += 1;
        while i < c.len() && c[i] != quote {
            if c[i] == '\\' {
                i += 1;
            }
            if at(i) == '\n' {
                *line += 1;
            }
            i += 1;
        }
        i + 1
    };
    // Skips a raw string `#*"…"#*` starting at `i` (at the first `#` or the quote).
    let skip_raw = |mut i: usize, line: &mut usize| -> usize {
        let mut hashes = 0;
        while at(i) == '#' {
            hashes += 1;
            i += 1;
        }
        i += 1; // the opening quote
        while i < c.len() {
            if c[i] == '"' && (1..=hashes).all(|k| at(i + k) == '#') {
                return i + 1 + hashes;
            }
            if c[i] == '\n' {
                *line += 1;
            }
            i += 1;
        }
        i
    };
    while i < c.len() {
        let ch = c[i];
        if ch == '\n' {
            line += 1;
            i += 1;
        } else if ch.is_whitespace() {
            i += 1;
        } else if ch == '/' && at(i + 1) == '/' {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if ch == '/' && at(i + 1) == '*' {
            let mut depth = 0usize;
            while i < c.len() {
                if c[i] == '/' && at(i + 1) == '*' {
                    depth += 1;
                    i += 2;
                } else if c[i] == '*' && at(i + 1) == '/' {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    if c[i] == '\n' {
                        line += 1;
                    }
                    i += 1;
                }
            }
        } else if ch == '"' {
            i = skip_quoted(i, '"', &mut line);
        } else if ch == '\'' {
            if at(i + 1) == '\\' {
                i = skip_quoted(i, '\'', &mut line); // '\n', '\'', '\u{..}'
            } else if at(i + 2) == '\'' {
                i += 3; // 'x'
            } else {
                i += 1; // a lifetime or a label: its name lexes as an identifier
            }
        } else if is_ident_start(ch) || ch.is_ascii_digit() {
            let start = i;
            while i < c.len() && is_ident_char(c[i]) {
                i += 1;
            }
            let word: String = c[start..i].iter().collect();
            let next = at(i);
            match word.as_str() {
                "b" | "c" if next == '"' => i = skip_quoted(i, '"', &mut line),
                "b" if next == '\'' => i = skip_quoted(i, '\'', &mut line),
                "r" | "br" | "cr" if next == '"' || (next == '#' && matches!(at(i + 1), '#' | '"')) => {
                    i = skip_raw(i, &mut line)
                }
                "r" if next == '#' && is_ident_start(at(i + 1)) => {} // r#ident: the ident follows
                _ => out.push(Token { tok: Tok::Ident(word), line }),
            }
        } else if ch == ':' && at(i + 1) == ':' {
            out.push(Token { tok: Tok::PathSep, line });
            i += 2;
        } else {
            out.push(Token { tok: Tok::Sym(ch), line });
            i += 1;
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Paths

/// A path found in a file, resolved against the file's module: `abs` starts at the crate root.
#[derive(Debug, Clone, PartialEq)]
struct PathRef {
    abs: Vec<String>,
    line: usize,
    /// Under `#[cfg(test)]`.
    test: bool,
}

struct Scan {
    refs: Vec<PathRef>,
    /// `#[macro_export] macro_rules! name`: such macros are named `crate::name!` anywhere.
    exported_macros: Vec<String>,
}

fn ident(t: Option<&Token>) -> Option<&str> {
    match t {
        Some(Token { tok: Tok::Ident(s), .. }) => Some(s),
        _ => None,
    }
}

fn is(t: Option<&Token>, want: &Tok) -> bool {
    t.is_some_and(|t| &t.tok == want)
}

/// Reads a use tree or a plain path from `i` (its first segment); pushes each leaf's raw
/// segments (with the line of its last segment) to `out`; returns the index past it.
fn use_tree(toks: &[Token], mut i: usize, mut prefix: Vec<String>, out: &mut Vec<(Vec<String>, usize)>) -> usize {
    let mut line = toks.get(i).map_or(0, |t| t.line);
    loop {
        match toks.get(i).map(|t| &t.tok) {
            Some(Tok::Ident(s)) => {
                // `{self, ..}` names the prefix itself.
                if s != "self" || prefix.is_empty() {
                    prefix.push(s.clone());
                }
                line = toks[i].line;
                i += 1;
                if is(toks.get(i), &Tok::PathSep) {
                    i += 1;
                    continue;
                }
                out.push((prefix, line));
                return i;
            }
            Some(Tok::Sym('{')) => {
                i += 1;
                loop {
                    if is(toks.get(i), &Tok::Sym('}')) || i >= toks.len() {
                        return i + 1;
                    }
                    i = use_tree(toks, i, prefix.clone(), out);
                    // Past `as name` and anything else up to this element's end.
                    let mut depth = 0usize;
                    while let Some(t) = toks.get(i) {
                        match t.tok {
                            Tok::Sym('{') => depth += 1,
                            Tok::Sym('}') if depth == 0 => break,
                            Tok::Sym('}') => depth -= 1,
                            Tok::Sym(',') if depth == 0 => {
                                i += 1;
                                break;
                            }
                            _ => {}
                        }
                        i += 1;
                    }
                }
            }
            Some(Tok::Sym('*')) => {
                out.push((prefix, line));
                return i + 1;
            }
            _ => {
                // `crate::f::<T>` and the like: the path so far.
                out.push((prefix, line));
                return i;
            }
        }
    }
}

/// Resolves raw segments (`crate::a::b`, `super::super::c`, `self::d`) against `module`, the
/// module the path is written in; `None` for a path that climbs out of the crate.
fn resolve(raw: &[String], module: &[String], crate_names: &[&str]) -> Option<Vec<String>> {
    let (mut abs, rest) = match raw.first().map(String::as_str) {
        Some(first) if crate_names.contains(&first) => (Vec::new(), &raw[1..]),
        Some("super") | Some("self") => (module.to_vec(), raw),
        _ => return None,
    };
    for seg in rest {
        match seg.as_str() {
            "super" => {
                abs.pop()?;
            }
            "self" => {}
            s => abs.push(s.to_string()),
        }
    }
    Some(abs)
}

/// Whether the attribute whose `[` is at `i` is `cfg(test)` / `cfg(all(test, ..))`.
fn cfg_test_attr(toks: &[Token], i: usize) -> bool {
    if ident(toks.get(i + 1)) != Some("cfg") || !is(toks.get(i + 2), &Tok::Sym('(')) {
        return false;
    }
    let (mut depth, mut j, mut test) = (0usize, i + 2, false);
    while let Some(t) = toks.get(j) {
        match &t.tok {
            Tok::Sym('(') => depth += 1,
            Tok::Sym(')') => {
                depth -= 1;
                if depth == 0 {
                    return test;
                }
            }
            Tok::Ident(s) if s == "not" => return false,
            Tok::Ident(s) if s == "test" => test = true,
            _ => {}
        }
        j += 1;
    }
    false
}

/// Every crate path in `src`, a file whose module is `module` (`["graph", "ops"]` for
/// `src/graph/ops.rs`). `crate_names` are the names of the library crate's root there:
/// `crate` in the library, `minfer` in the binary.
fn scan_source(src: &str, module: &[&str], crate_names: &[&str]) -> Scan {
    let toks = lex(src);
    let file_module: Vec<String> = module.iter().map(|s| s.to_string()).collect();
    // Open braces: (the inline module it opens, whether it is test code).
    let mut stack: Vec<(Option<String>, bool)> = Vec::new();
    let mut pending_mod: Option<String> = None;
    let mut pending_test = false;
    let mut file_test = false;
    let mut macro_export = false;
    let mut scan = Scan { refs: Vec::new(), exported_macros: Vec::new() };
    let mut i = 0;
    while i < toks.len() {
        let prev = if i > 0 { Some(&toks[i - 1].tok) } else { None };
        match &toks[i].tok {
            Tok::Sym('#') => {
                let inner = is(toks.get(i + 1), &Tok::Sym('!'));
                let open = if inner { i + 2 } else { i + 1 };
                if is(toks.get(open), &Tok::Sym('[')) {
                    if cfg_test_attr(&toks, open) {
                        if inner && stack.is_empty() {
                            file_test = true;
                        } else {
                            pending_test = true;
                        }
                    }
                    if ident(toks.get(open + 1)) == Some("macro_export") {
                        macro_export = true;
                    }
                }
                i += 1;
            }
            Tok::Sym('{') => {
                let test = pending_test || stack.last().is_some_and(|f| f.1);
                stack.push((pending_mod.take(), test));
                pending_test = false;
                i += 1;
            }
            Tok::Sym('}') => {
                stack.pop();
                pending_mod = None;
                pending_test = false;
                i += 1;
            }
            Tok::Sym(';') => {
                pending_mod = None;
                pending_test = false;
                i += 1;
            }
            Tok::Ident(kw) if kw == "mod" && prev != Some(&Tok::PathSep) => {
                if let (Some(name), true) = (ident(toks.get(i + 1)), is(toks.get(i + 2), &Tok::Sym('{'))) {
                    pending_mod = Some(name.to_string());
                }
                i += 1;
            }
            Tok::Ident(kw) if kw == "macro_rules" && is(toks.get(i + 1), &Tok::Sym('!')) => {
                if let (true, Some(name)) = (macro_export, ident(toks.get(i + 2))) {
                    scan.exported_macros.push(name.to_string());
                }
                macro_export = false;
                i += 1;
            }
            Tok::Ident(first)
                if is(toks.get(i + 1), &Tok::PathSep)
                    && (crate_names.contains(&first.as_str()) || first == "super" || first == "self")
                    && !matches!(prev, Some(Tok::PathSep) | Some(Tok::Sym('.'))) =>
            {
                let module: Vec<String> =
                    file_module.iter().cloned().chain(stack.iter().filter_map(|f| f.0.clone())).collect();
                let test = file_test || pending_test || stack.last().is_some_and(|f| f.1);
                let mut raw = Vec::new();
                let next = use_tree(&toks, i, Vec::new(), &mut raw);
                for (segs, line) in raw {
                    if let Some(abs) = resolve(&segs, &module, crate_names) {
                        scan.refs.push(PathRef { abs, line, test });
                    }
                }
                i = next.max(i + 1);
            }
            _ => i += 1,
        }
    }
    scan
}

// ---------------------------------------------------------------------------------------------
// The graph

struct Crate {
    /// Unit names, from the file system.
    units: BTreeSet<String>,
    /// Per edge (from, to): every reference making it, `path:line`, and whether each is test code.
    edges: BTreeMap<(String, String), Vec<(String, bool)>>,
    files: usize,
}

fn rs_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir).expect("read src").map(|e| e.expect("dir entry").path()).collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            rs_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

/// The path of `rel` (relative to `src/`) as a module path, and its unit.
fn file_module(rel: &[String], units: &BTreeSet<String>) -> (Vec<String>, String) {
    let mut module: Vec<String> = rel.to_vec();
    let last = module.pop().expect("a file name");
    let stem = last.trim_end_matches(".rs");
    if !(stem == "mod" || (module.is_empty() && (stem == "lib" || stem == "main"))) {
        module.push(stem.to_string());
    }
    let unit = if rel.len() == 1 && stem == "main" { "main".to_string() } else { unit_of(&module, units, &BTreeMap::new()) };
    (module, unit)
}

fn unit_of(abs: &[String], units: &BTreeSet<String>, macros: &BTreeMap<String, String>) -> String {
    let Some(first) = abs.first() else { return ROOT.into() };
    if abs.len() == 1
        && let Some(u) = macros.get(first)
    {
        return u.clone();
    }
    if !units.contains(first) {
        return ROOT.into(); // an item of lib.rs
    }
    if let Some(second) = abs.get(1).filter(|_| SPLIT_FOLDERS.contains(&first.as_str())) {
        let sub = format!("{first}::{second}");
        if units.contains(&sub) {
            return sub;
        }
    }
    first.clone()
}

fn read_crate(root: &Path) -> Crate {
    let src = root.join("src");
    let mut files = Vec::new();
    rs_files(&src, &mut files);
    let rel = |p: &Path| -> Vec<String> {
        p.strip_prefix(&src).expect("under src").components().map(|c| c.as_os_str().to_string_lossy().into_owned()).collect()
    };
    let mut units = BTreeSet::new();
    for f in &files {
        let r = rel(f);
        let top = r[0].trim_end_matches(".rs").to_string();
        if r.len() == 1 && (top == "lib" || top == "main") {
            continue;
        }
        if r.len() > 2 && SPLIT_FOLDERS.contains(&top.as_str()) {
            units.insert(format!("{top}::{}", r[1]));
        }
        units.insert(top);
    }
    units.insert(ROOT.into());
    units.insert("main".into());
    let mut scans = Vec::new();
    let mut macros = BTreeMap::new();
    for f in &files {
        let r = rel(f);
        let (module, unit) = file_module(&r, &units);
        let text = std::fs::read_to_string(f).expect("read a source file");
        let module: Vec<&str> = module.iter().map(String::as_str).collect();
        let names: &[&str] = if unit == "main" { &["minfer"] } else { &["crate"] };
        let scan = scan_source(&text, &module, names);
        for m in &scan.exported_macros {
            macros.insert(m.clone(), unit.clone());
        }
        scans.push((format!("src/{}", r.join("/")), unit, scan));
    }
    let mut edges: BTreeMap<(String, String), Vec<(String, bool)>> = BTreeMap::new();
    for (path, unit, scan) in &scans {
        for r in &scan.refs {
            let to = unit_of(&r.abs, &units, &macros);
            if &to != unit {
                edges.entry((unit.clone(), to)).or_default().push((format!("{path}:{}", r.line), r.test));
            }
        }
    }
    Crate { units, edges, files: files.len() }
}

type Graph = BTreeMap<String, BTreeSet<String>>;

fn graph_of<'a>(edges: impl Iterator<Item = &'a (String, String)>) -> Graph {
    let mut g = Graph::new();
    for (a, b) in edges {
        g.entry(a.clone()).or_default().insert(b.clone());
        g.entry(b.clone()).or_default();
    }
    g
}

/// The shortest path `from` ->* `to` in `g` (both ends included).
fn shortest_path(g: &Graph, from: &str, to: &str) -> Option<Vec<String>> {
    let mut came: BTreeMap<&str, &str> = BTreeMap::new();
    let mut queue = VecDeque::from([from]);
    while let Some(n) = queue.pop_front() {
        for m in g.get(n).into_iter().flatten() {
            if came.contains_key(m.as_str()) || m == from {
                continue;
            }
            came.insert(m, n);
            if m == to {
                let mut path = vec![to.to_string()];
                let mut at = to;
                while at != from {
                    at = came[at];
                    path.push(at.to_string());
                }
                path.reverse();
                return Some(path);
            }
            queue.push_back(m);
        }
    }
    None
}

/// One cycle per edge that is on a cycle (that edge, then the shortest way back), each cycle
/// once, as node lists `[a, b, .., a]`.
fn cycles(g: &Graph) -> Vec<Vec<String>> {
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for (a, outs) in g {
        for b in outs {
            let Some(back) = shortest_path(g, b, a) else { continue };
            let mut cycle = vec![a.clone()];
            cycle.extend(back);
            // The same cycle from another edge: compare the rotation starting at its least node.
            let ring = &cycle[..cycle.len() - 1];
            let k = (0..ring.len()).min_by_key(|&k| &ring[k]).unwrap_or(0);
            let key: Vec<String> = ring[k..].iter().chain(&ring[..k]).cloned().collect();
            if seen.insert(key) {
                out.push(cycle);
            }
        }
    }
    out
}

/// Units by layer: layer 0 imports nothing, layer n only from layers below it. `None` when
/// the graph has a cycle.
fn layers(g: &Graph) -> Option<Vec<Vec<String>>> {
    let mut placed: BTreeMap<&str, usize> = BTreeMap::new();
    while placed.len() < g.len() {
        let before = placed.len();
        for (n, outs) in g {
            if placed.contains_key(n.as_str()) {
                continue;
            }
            if outs.iter().all(|m| placed.contains_key(m.as_str())) {
                let layer = outs.iter().map(|m| placed[m.as_str()] + 1).max().unwrap_or(0);
                placed.insert(n, layer);
            }
        }
        if placed.len() == before {
            return None;
        }
    }
    let mut out = vec![Vec::new(); placed.values().max().map_or(0, |m| m + 1)];
    for (n, l) in placed {
        out[l].push(n.to_string());
    }
    Some(out)
}

fn describe(refs: &[(String, bool)]) -> String {
    let tests_only = refs.iter().all(|r| r.1);
    let first = refs.iter().find(|r| !r.1).unwrap_or(&refs[0]);
    format!("{} refs, e.g. {}{}", refs.len(), first.0, if tests_only { " (test code only)" } else { "" })
}

#[test]
fn the_folder_graph_has_no_cycle() {
    let krate = read_crate(Path::new(env!("CARGO_MANIFEST_DIR")));
    assert!(krate.files > 10 && krate.edges.len() > 5, "the scan found {} files and {} edges", krate.files, krate.edges.len());

    let mut report = String::new();
    writeln!(report, "units: {}", krate.units.iter().cloned().collect::<Vec<_>>().join(", ")).unwrap();
    writeln!(report, "edges ({}), from -> to: references (e.g. one that makes it):", krate.edges.len()).unwrap();
    for ((a, b), refs) in &krate.edges {
        writeln!(report, "  {a} -> {b}: {}", describe(refs)).unwrap();
    }

    let mut problems = Vec::new();
    for &(a, b) in KNOWN_CYCLES {
        let edge = (a.to_string(), b.to_string());
        if !krate.edges.contains_key(&edge) {
            problems.push(format!("KNOWN_CYCLES lists {a} -> {b}, which no file makes any more: remove it"));
        }
    }
    let full = graph_of(krate.edges.keys());
    for &(a, b) in KNOWN_CYCLES {
        if krate.edges.contains_key(&(a.to_string(), b.to_string())) && shortest_path(&full, b, a).is_none() {
            problems.push(format!("KNOWN_CYCLES lists {a} -> {b}, which is on no cycle any more: remove it"));
        }
    }
    let tolerated = |e: &(String, String)| KNOWN_CYCLES.iter().any(|&(a, b)| e.0 == a && e.1 == b);
    let checked = graph_of(krate.edges.keys().filter(|e| !tolerated(e)));
    for cycle in cycles(&checked) {
        let mut msg = format!("cycle: {}", cycle.join(" -> "));
        for w in cycle.windows(2) {
            let refs = &krate.edges[&(w[0].clone(), w[1].clone())];
            write!(msg, "\n    {} -> {}: {}", w[0], w[1], describe(refs)).unwrap();
        }
        problems.push(msg);
    }
    match layers(&checked) {
        Some(layers) => {
            writeln!(report, "layers (layer 0 imports no other unit, each later one only from earlier ones):").unwrap();
            for (k, units) in layers.iter().enumerate() {
                writeln!(report, "  layer {k}: {}", units.join(", ")).unwrap();
            }
        }
        None => writeln!(report, "layers: none (the graph has a cycle)").unwrap(),
    }
    if !KNOWN_CYCLES.is_empty() {
        writeln!(report, "tolerated (KNOWN_CYCLES): {KNOWN_CYCLES:?}").unwrap();
    }
    println!("{report}");
    assert!(problems.is_empty(), "the folder import graph:\n{}\n{report}", problems.join("\n"));
}

// ---------------------------------------------------------------------------------------------
// The scanner's own tests

fn abs_paths(src: &str, module: &[&str]) -> Vec<String> {
    scan_source(src, module, &["crate"]).refs.iter().map(|r| r.abs.join("::")).collect()
}

#[test]
fn scanner_reads_use_items_groups_and_inline_paths() {
    let src = r#"
use crate::graph::Op;
use crate::{gguf::GgufFile, quants::{self, GgmlType as T, dot::*}};
pub(crate) fn f() -> crate::vec_ops::Pool { crate::tokenizer::Tokenizer::new::<u8>() }
pub(in crate::server) struct S;
"#;
    assert_eq!(
        abs_paths(src, &["server", "x"]),
        [
            "graph::Op",
            "gguf::GgufFile",
            "quants",
            "quants::GgmlType",
            "quants::dot",
            "vec_ops::Pool",
            "tokenizer::Tokenizer::new",
            "server"
        ]
    );
}

#[test]
fn scanner_skips_comments_strings_chars_and_lifetimes() {
    let src = r####"
// use crate::a::X;
/// crate::b::Y in a doc comment
//! crate::c
/* crate::d /* nested crate::e */ crate::f */
fn g<'a>(x: &'a str) -> char {
    let s = "crate::g::h \" crate::i";
    let r = r#"crate::j "quoted" crate::k"#;
    let b = b"crate::l";
    let q = '"'; let e = '\''; let n = 'x';
    let _ = crate::real::Thing;
    'outer: loop { break 'outer; }
    '{'
}
"####;
    assert_eq!(abs_paths(src, &["m"]), ["real::Thing"]);
    let lines: Vec<usize> = scan_source(src, &["m"], &["crate"]).refs.iter().map(|r| r.line).collect();
    assert_eq!(lines, [11]);
}

#[test]
fn scanner_resolves_super_and_inline_modules() {
    let src = r#"
use super::sibling::A;
use super::super::other::B;
use self::child::C;
mod inner {
    use super::super::D;
    use super::{self as me, E};
}
#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::F;
}
use crate::after::G;
"#;
    let scan = scan_source(src, &["top", "file"], &["crate"]);
    let got: Vec<(String, bool)> = scan.refs.iter().map(|r| (r.abs.join("::"), r.test)).collect();
    let want = [
        ("top::sibling::A", false),
        ("other::B", false),
        ("top::file::child::C", false),
        ("top::D", false),
        ("top::file", false),
        ("top::file::E", false),
        ("top::file", true),
        ("fixtures::F", true),
        ("after::G", false),
    ];
    assert_eq!(got, want.map(|(p, t)| (p.to_string(), t)));
    // Climbing out of the crate is no path of it.
    assert!(abs_paths("use super::super::x;", &["top"]).is_empty());
}

#[test]
fn scanner_maps_paths_to_units() {
    let units: BTreeSet<String> = ["graph", "backends", "backends::cpu", "quants", ROOT].map(String::from).into();
    let macros = BTreeMap::from([("with_weight_block".to_string(), "quants".to_string())]);
    let unit = |p: &str| unit_of(&p.split("::").map(String::from).collect::<Vec<_>>(), &units, &macros);
    assert_eq!(unit("graph::ops::Op"), "graph");
    assert_eq!(unit("backends::cpu::matmul"), "backends::cpu");
    assert_eq!(unit("backends::Registry"), "backends");
    assert_eq!(unit("with_weight_block"), "quants");
    assert_eq!(unit("SomeRootItem"), ROOT);
    let scan = scan_source("#[macro_export]\nmacro_rules! m { () => { $crate::quants::X } }", &["quants"], &["crate"]);
    assert_eq!(scan.exported_macros, ["m"]);
    let rel = |p: &str| p.split('/').map(String::from).collect::<Vec<_>>();
    assert_eq!(file_module(&rel("backends/cpu/mod.rs"), &units), (rel("backends/cpu"), "backends::cpu".into()));
    assert_eq!(file_module(&rel("graph/ops.rs"), &units), (rel("graph/ops"), "graph".into()));
    assert_eq!(file_module(&rel("lib.rs"), &units).1, ROOT);
}
