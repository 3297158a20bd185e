//! The library's modules form layers: each imports only modules below it, so no import circle
//! exists between two of them. This test reads the crate's own sources, draws the arrows between
//! its top-level modules (`crate::a` named anywhere in module `b`'s code, tests and comments
//! left out), and fails on any circle, naming the arrows that close it.
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

#[test]
fn modules_import_only_modules_below_them() {
    let graph = graph();
    assert!(graph.len() > 10, "the sources were found: {graph:?}");
    let (layers, left) = layers(&graph);
    for (n, layer) in layers.iter().enumerate() {
        println!("layer {n}: {}", layer.join(", "));
    }
    let mut circle = String::new();
    for m in &left {
        for (to, items) in &graph[m] {
            if reaches(&graph, to, m) {
                let items: Vec<&str> = items.iter().map(String::as_str).collect();
                circle.push_str(&format!("\n  {m} -> {to}: {}", items.join(", ")));
            }
        }
    }
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
