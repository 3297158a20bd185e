//! The library's modules form layers: each imports only modules below it, so no import circle
//! exists between two of them. This test reads the crate's own sources, draws the arrows between
//! its top-level modules (`crate::a` named anywhere in module `b`'s code, tests and comments
//! left out), and fails on any circle, naming the arrows that close it. Inside each folder, of
//! the library and of the simulator, the same holds between its submodules and the folder's own
//! code (a facade's re-exports aside), but for the circles listed in [`FOLDER_CIRCLES`].
//!
//! `cargo test --test layers -- --nocapture` prints the layers, lowest first: the repository
//! layout in `docs/contributing.md` shows the same.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

type Graph = BTreeMap<String, BTreeMap<String, BTreeSet<String>>>;

/// Every `.rs` file under `dir`.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("source folder") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The code of a file without its comments and its test module (by convention, the last item
/// of a file, after `#[cfg(test)]`).
fn code(text: &str) -> String {
    let mut out = String::new();
    for line in text.lines() {
        let t = line.trim_start();
        if t.starts_with("#[cfg(test)]") {
            break;
        }
        if t.starts_with("//") {
            continue;
        }
        out.push_str(line.split(" //").next().unwrap_or(line));
        out.push('\n');
    }
    out
}

/// The top-level modules named by `crate::` paths in `code`, with the item named after each.
fn imports(code: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find("crate::") {
        let before = rest[..at].chars().last();
        rest = &rest[at + "crate::".len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue; // `watchrelay_sim::` or the like
        }
        let module: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        let item: String = rest[module.len()..]
            .trim_start_matches("::")
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == '{')
            .collect();
        if !module.is_empty() {
            out.push((module, item));
        }
    }
    out
}

/// The arrows between the library's top-level modules: module -> module it imports -> names.
fn graph() -> Graph {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    let mut graph = Graph::new();
    for file in files {
        let rel = file.strip_prefix(&src).expect("under src");
        let first = rel.components().next().expect("a component");
        let module = first
            .as_os_str()
            .to_string_lossy()
            .trim_end_matches(".rs")
            .to_string();
        if module == "main" || module == "lib" || rel.ends_with("tests.rs") {
            continue;
        }
        let text = std::fs::read_to_string(&file).expect("readable source");
        let arrows = graph.entry(module.clone()).or_default();
        for (to, item) in imports(&code(&text)) {
            if to != module {
                arrows.entry(to).or_default().insert(item);
            }
        }
    }
    graph
}

/// The modules in layers, lowest first; what is left over stands in a circle.
fn layers(graph: &Graph) -> (Vec<Vec<String>>, BTreeSet<String>) {
    let mut placed: BTreeSet<String> = BTreeSet::new();
    let mut layers = Vec::new();
    loop {
        let layer: Vec<String> = graph
            .iter()
            .filter(|(m, to)| !placed.contains(*m) && to.keys().all(|t| placed.contains(t)))
            .map(|(m, _)| m.clone())
            .collect();
        if layer.is_empty() {
            break;
        }
        placed.extend(layer.iter().cloned());
        layers.push(layer);
    }
    let left = graph
        .keys()
        .filter(|m| !placed.contains(*m))
        .cloned()
        .collect();
    (layers, left)
}

/// Whether `from` imports `to`, directly or through other modules.
fn reaches(graph: &Graph, from: &str, to: &str) -> bool {
    let mut seen = BTreeSet::new();
    let mut todo = vec![from];
    while let Some(m) = todo.pop() {
        if m == to {
            return true;
        }
        if seen.insert(m) {
            todo.extend(
                graph
                    .get(m)
                    .into_iter()
                    .flat_map(|t| t.keys().map(String::as_str)),
            );
        }
    }
    false
}

/// The arrows of `graph` that close a circle among `left`, each on a line of its own after
/// `indent`, with the names it imports.
fn arrows_in_circles(graph: &Graph, left: &BTreeSet<String>, indent: &str) -> String {
    let mut out = String::new();
    for m in left {
        for (to, items) in &graph[m] {
            if reaches(graph, to, m) {
                let items: Vec<&str> = items.iter().map(String::as_str).collect();
                out.push_str(&format!("{indent}{m} -> {to}: {}", items.join(", ")));
            }
        }
    }
    out
}

#[test]
fn modules_import_only_modules_below_them() {
    let graph = graph();
    assert!(graph.len() > 10, "the sources were found: {graph:?}");
    let (layers, left) = layers(&graph);
    for (n, layer) in layers.iter().enumerate() {
        println!("layer {n}: {}", layer.join(", "));
    }
    let circle = arrows_in_circles(&graph, &left, "\n  ");
    assert!(left.is_empty(), "modules in an import circle:{circle}");
}

/// The layer table of `src/lib.rs` (`//! | n | modules | owns |`) is the one the imports make:
/// each module in the layer of the longest chain of imports under it.
#[test]
fn the_layer_table_in_lib_rs_is_the_imports() {
    let graph = graph();
    let (layers, _) = layers(&graph);
    let lib = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/lib.rs"))
        .expect("src/lib.rs");
    let mut table: Vec<BTreeSet<String>> = Vec::new();
    for line in lib.lines() {
        let Some(row) = line.strip_prefix("//! | ") else {
            continue;
        };
        let mut cells = row.split(" | ");
        let (Some(n), Some(modules)) = (cells.next(), cells.next()) else {
            continue;
        };
        let Ok(n) = n.trim().parse::<usize>() else {
            continue;
        };
        assert_eq!(
            n,
            table.len(),
            "the table's layers are numbered from 0 in order"
        );
        table.push(
            modules
                .split(',')
                .map(|m| m.trim().trim_matches(|c| "[]`".contains(c)).to_string())
                .collect(),
        );
    }
    let made: Vec<BTreeSet<String>> = layers.iter().map(|l| l.iter().cloned().collect()).collect();
    assert_eq!(
        table, made,
        "src/lib.rs's layer table differs from the layers the imports make (run `cargo test --test layers -- --nocapture` to print them)"
    );
}

/// The end-to-end tests are selected by name (`--test 'kafka_*'`, `'tables_*'`, `'cluster_*'`), and
/// each needs the `e2e` feature, so plain `cargo test` never runs one without its broker.
#[test]
fn end_to_end_tests_are_named_by_tier_and_need_the_feature() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).expect("Cargo.toml");
    let mut e2e = 0;
    for entry in std::fs::read_dir(root.join("tests")).expect("tests/") {
        let name = entry
            .expect("entry")
            .file_name()
            .to_string_lossy()
            .to_string();
        let Some(stem) = name.strip_suffix(".rs") else {
            continue;
        };
        let declared = format!("name = \"{stem}\"\nrequired-features = [\"e2e\"]");
        let tier = ["kafka_", "tables_", "cluster_"]
            .iter()
            .any(|t| stem.starts_with(t));
        assert_eq!(
            manifest.contains(&declared),
            tier,
            "tests/{name}: an end-to-end test is named kafka_*, tables_* or cluster_* and declared in Cargo.toml with required-features = [\"e2e\"]; no other test is"
        );
        e2e += usize::from(tier);
    }
    assert!(e2e > 10, "the end-to-end tests were found");
}

#[test]
fn the_reader_sees_paths_and_skips_tests_and_comments() {
    let text = "use crate::a::B;\n// crate::c\nfn f() { crate::d::e(); } // crate::f\n\
                #[cfg(test)]\nmod tests { use crate::g; }\n";
    let names: Vec<String> = imports(&code(text)).into_iter().map(|(m, _)| m).collect();
    assert_eq!(names, ["a", "d"]);
    let mut g = Graph::new();
    g.entry("a".into())
        .or_default()
        .entry("b".into())
        .or_default();
    g.entry("b".into())
        .or_default()
        .entry("a".into())
        .or_default();
    g.entry("c".into()).or_default();
    let (layers, left) = layers(&g);
    assert_eq!(layers, [vec!["c".to_string()]]);
    assert_eq!(left.len(), 2);
    assert!(reaches(&g, "a", "b") && reaches(&g, "b", "a") && !reaches(&g, "a", "c"));
}

/// The module path of a source file under a crate's `src` (`a/b.rs` and `a/b/mod.rs` are
/// `[a, b]`, `lib.rs` is `[]`); `None` for the binaries and for test files.
fn module_path(rel: &Path) -> Option<Vec<String>> {
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().to_string())
        .collect();
    let last = parts.pop()?;
    let stem = last.strip_suffix(".rs")?;
    if stem == "tests" || stem == "main" || parts.first().is_some_and(|p| p == "bin") {
        return None;
    }
    if stem != "mod" && stem != "lib" {
        parts.push(stem.to_string());
    }
    Some(parts)
}

/// `code` without its `pub use` statements: a facade's re-exports are not its own code's needs.
fn without_reexports(code: &str) -> String {
    let mut out = String::new();
    let mut skipping = false;
    for line in code.lines() {
        let t = line.trim_start();
        if !skipping && (t.starts_with("pub use ") || t.starts_with("pub(crate) use ")) {
            skipping = true;
        }
        if !skipping {
            out.push_str(line);
            out.push('\n');
        }
        if skipping && t.contains(';') {
            skipping = false;
        }
    }
    out
}

/// The paths named in the code of module `at`, made absolute: `crate::`, `self::` and
/// `super::` ones, and those starting with one of `children` (the module's own submodules),
/// each with the first name of every item of a `{…}` group.
fn named_paths(code: &str, at: &[String], children: &BTreeSet<String>) -> Vec<Vec<String>> {
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    let bytes: Vec<char> = code.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let starts = i == 0 || !(ident(bytes[i - 1]) || bytes[i - 1] == ':');
        if !starts || !ident(bytes[i]) {
            i += 1;
            continue;
        }
        // One path: segments joined by `::`, perhaps ending in a `{…}` group.
        let mut segments = Vec::new();
        let mut j = i;
        loop {
            let s: String = bytes[j..].iter().take_while(|c| ident(**c)).collect();
            if s.is_empty() {
                break;
            }
            j += s.chars().count();
            segments.push(s);
            if bytes.get(j) == Some(&':') && bytes.get(j + 1) == Some(&':') {
                j += 2;
                if bytes.get(j) == Some(&'{') {
                    // The group's items at its own depth (a nested group counts by its head).
                    let mut depth = 0;
                    let mut close = bytes.len();
                    let mut items = vec![String::new()];
                    for (k, c) in bytes.iter().enumerate().skip(j) {
                        match c {
                            '{' => depth += 1,
                            '}' if depth == 1 => {
                                close = k;
                                break;
                            }
                            '}' => depth -= 1,
                            ',' if depth == 1 => items.push(String::new()),
                            _ if depth == 1 => items.last_mut().expect("one item").push(*c),
                            _ => {}
                        }
                    }
                    for item in items {
                        let name: String = item.trim().chars().take_while(|c| ident(*c)).collect();
                        if !name.is_empty() {
                            out.push((segments.clone(), Some(name)));
                        }
                    }
                    j = close;
                    segments.clear();
                    break;
                }
                continue;
            }
            break;
        }
        i = j.max(i + 1);
        if segments.len() >= 2 {
            out.push((segments, None));
        }
    }
    out.into_iter()
        .filter_map(|(mut segments, item)| {
            segments.extend(item);
            let mut base: Vec<String> = match segments[0].as_str() {
                "crate" => Vec::new(),
                "self" => at.to_vec(),
                "super" => at.to_vec(),
                s if children.contains(s) => at.to_vec(),
                _ => return None,
            };
            let mut rest = segments.as_slice();
            if rest[0] == "crate" || rest[0] == "self" {
                rest = &rest[1..];
            }
            while rest.first().is_some_and(|s| s == "super") {
                base.pop()?;
                rest = &rest[1..];
            }
            base.extend(rest.iter().cloned());
            Some(base)
        })
        .collect()
}

/// Inside each folder of the crate at `src`: the arrows between its submodules and its own
/// code (`mod.rs` or `lib.rs`, named `(mod)`, whose re-exports do not count), keyed by the
/// folder's path.
fn folder_graphs(src: &Path) -> BTreeMap<String, Graph> {
    let mut files = Vec::new();
    sources(src, &mut files);
    let modules: Vec<(Vec<String>, String)> = files
        .iter()
        .filter_map(|f| {
            let rel = f.strip_prefix(src).expect("under src");
            Some((module_path(rel)?, code(&std::fs::read_to_string(f).ok()?)))
        })
        .collect();
    let known: BTreeSet<&[String]> = modules.iter().map(|(m, _)| m.as_slice()).collect();
    let children_of = |folder: &[String]| -> BTreeSet<String> {
        known
            .iter()
            .filter(|m| m.len() == folder.len() + 1 && m.starts_with(folder))
            .map(|m| m[folder.len()].clone())
            .collect()
    };
    let mut graphs = BTreeMap::new();
    for folder in known.iter().filter(|f| !children_of(f).is_empty()) {
        let children = children_of(folder);
        // Names the folder's own code takes from a submodule (`use x::Name`, re-exported or not).
        let mut from_child: BTreeMap<String, String> = BTreeMap::new();
        if let Some((_, own)) = modules.iter().find(|(m, _)| m.as_slice() == *folder) {
            for p in named_paths(own, folder, &children) {
                if p.len() == folder.len() + 2 && p.starts_with(folder) {
                    from_child.insert(p[folder.len() + 1].clone(), p[folder.len()].clone());
                }
            }
        }
        let node = |name: &str| -> String {
            if children.contains(name) {
                name.to_string()
            } else if let Some(child) = from_child.get(name) {
                child.clone()
            } else {
                "(mod)".to_string()
            }
        };
        let mut graph = Graph::new();
        for (m, text) in modules.iter().filter(|(m, _)| m.starts_with(folder)) {
            let from = m
                .get(folder.len())
                .cloned()
                .unwrap_or_else(|| "(mod)".into());
            let text = if m.len() == folder.len() {
                without_reexports(text)
            } else {
                text.clone()
            };
            let own_children = children_of(m);
            let arrows = graph.entry(from.clone()).or_default();
            for p in named_paths(&text, m, &own_children) {
                if p.len() <= folder.len() || !p.starts_with(folder) {
                    continue;
                }
                let name = &p[folder.len()];
                let to = node(name);
                if to != from {
                    let item = if children.contains(name) {
                        p.get(folder.len() + 1).cloned().unwrap_or_default()
                    } else {
                        name.clone()
                    };
                    arrows.entry(to).or_default().insert(item);
                }
            }
        }
        graphs.insert(folder.join("/"), graph);
    }
    graphs
}

/// The circles still standing inside a folder, each with what it would take to undo it. The
/// test fails when one closes too (remove it here) or a new one appears. None is left.
const FOLDER_CIRCLES: &[(&str, &[&str], &str)] = &[];

#[test]
fn no_module_imports_its_folders_code_while_that_code_imports_it() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut circles: BTreeMap<String, (BTreeSet<String>, String)> = BTreeMap::new();
    for (krate, src) in [("", root.join("src")), ("sim/", root.join("sim/src"))] {
        for (folder, graph) in folder_graphs(&src) {
            // The library's top level is the layer table's (see above).
            if krate.is_empty() && folder.is_empty() {
                continue;
            }
            let (_, left) = layers(&graph);
            let circle = arrows_in_circles(&graph, &left, "\n    ");
            // Left unplaced are the modules on a circle and those above them: only the former.
            let on_circles: BTreeSet<String> = left
                .iter()
                .filter(|m| graph[*m].keys().any(|to| reaches(&graph, to, m)))
                .cloned()
                .collect();
            if !on_circles.is_empty() {
                let at = format!("{krate}src/{folder}");
                circles.insert(at.trim_end_matches('/').to_string(), (on_circles, circle));
            }
        }
    }
    // The modules of each circle left, so that none grows unseen.
    let known: BTreeMap<&str, BTreeSet<String>> = FOLDER_CIRCLES
        .iter()
        .map(|(f, modules, _)| (*f, modules.iter().map(|m| m.to_string()).collect()))
        .collect();
    let found: BTreeMap<&str, BTreeSet<String>> = circles
        .iter()
        .map(|(f, (left, _))| (f.as_str(), left.clone()))
        .collect();
    let report: String = circles
        .iter()
        .map(|(f, (_, c))| format!("\n  {f}:{c}"))
        .collect();
    assert_eq!(found, known, "import circles inside folders:{report}");
}

#[test]
fn the_folder_reader_resolves_relative_paths_and_groups() {
    let at = ["f".to_string(), "m".to_string()];
    let children: BTreeSet<String> = ["child".to_string()].into();
    let code =
        "use super::{a::{B, E}, C};\nfn f() { crate::x::y(); child::z(); self::w::v(); other::q(); }\n";
    let got: Vec<String> = named_paths(code, &at, &children)
        .into_iter()
        .map(|p| p.join("::"))
        .collect();
    assert_eq!(
        got,
        ["f::a", "f::C", "x::y", "f::m::child::z", "f::m::w::v"]
    );
    assert_eq!(
        module_path(Path::new("a/b/mod.rs")),
        Some(vec!["a".to_string(), "b".to_string()])
    );
    assert_eq!(module_path(Path::new("a/tests.rs")), None);
    assert_eq!(
        without_reexports("pub use a::{\n  B,\n};\nuse c::D;\n"),
        "use c::D;\n"
    );
}
