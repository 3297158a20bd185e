//! The documentation against the code: it fails when either drifts from the other.
//!
//! - Every configuration field the file accepts ([`watchrelay::config::field_paths`]) is a row
//!   of the field table in `docs/configuration.md`, and every row there is a field it accepts.
//! - Every metric the relay registers ([`watchrelay::metrics::Metrics::described`]) is a row of
//!   the metric table in `docs/metrics.md`, with its type and its labels, and every row there is
//!   a registered metric; every alert of `deploy/prometheus-rules.yaml` is in its alert table.
//! - Every relative link of the repository's Markdown files leads to a file, and an anchor to a
//!   heading of it (GitHub's slugs); every `docs/*.md` named in the sources, the chart, the
//!   deploy files and the scripts exists.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use watchrelay::metrics::Metrics;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Lines outside fenced code blocks, with their line numbers.
fn prose(text: &str) -> Vec<(usize, &str)> {
    let mut fenced = false;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if !fenced {
            out.push((i + 1, line));
        }
    }
    out
}

/// The cells of a table row, trimmed; `|` inside code spans (written `\|`) stays in its cell.
fn cells(row: &str) -> Vec<String> {
    let inner = row.trim().trim_start_matches('|').trim_end_matches('|');
    let mut out = vec![String::new()];
    let mut escaped = false;
    for c in inner.chars() {
        match c {
            '|' if !escaped => out.push(String::new()),
            _ => out.last_mut().expect("one cell at least").push(c),
        }
        escaped = c == '\\';
    }
    out.into_iter().map(|c| c.trim().to_string()).collect()
}

/// The rows of every table of `text` whose header's first cell is `first`: each row's cells,
/// with its line number.
fn table_rows(text: &str, first: &str) -> Vec<(usize, Vec<String>)> {
    let mut rows = Vec::new();
    let mut inside = false;
    for (n, line) in prose(text) {
        if !line.trim_start().starts_with('|') {
            inside = false;
            continue;
        }
        let row = cells(line);
        if row.iter().all(|c| c.chars().all(|c| c == '-' || c == ':')) {
            continue;
        }
        if !inside {
            inside = row.first().map(String::as_str) == Some(first);
            if inside {
                continue;
            }
        }
        if inside {
            rows.push((n, row));
        }
    }
    rows
}

/// The code spans of `cell`, in order.
fn code_spans(cell: &str) -> Vec<&str> {
    cell.split('`').skip(1).step_by(2).collect()
}

#[test]
fn every_configuration_field_is_documented_and_every_documented_one_exists() {
    let doc_path = root().join("docs/configuration.md");
    let doc = read(&doc_path);
    let rows = table_rows(&doc, "field");
    assert!(
        !rows.is_empty(),
        "docs/configuration.md has no table whose first column is `field`"
    );
    let mut documented = BTreeSet::new();
    for (line, row) in &rows {
        let spans = code_spans(&row[0]);
        assert!(
            spans.len() == 1 && row[0] == format!("`{}`", spans[0]),
            "docs/configuration.md:{line}: the first cell must be one field path in backticks, \
             e.g. `kubernetes.watchTimeoutSeconds`, not {:?}",
            row[0]
        );
        assert!(
            documented.insert(spans[0].to_string()),
            "docs/configuration.md:{line}: {} documented twice",
            spans[0]
        );
    }
    let accepted: BTreeSet<String> = watchrelay::config::field_paths().into_iter().collect();
    let undocumented: Vec<_> = accepted.difference(&documented).collect();
    let unknown: Vec<_> = documented.difference(&accepted).collect();
    assert!(
        undocumented.is_empty() && unknown.is_empty(),
        "docs/configuration.md and the configuration file differ:\n  \
         accepted but not documented: {undocumented:?}\n  \
         documented but not accepted: {unknown:?}"
    );
}

#[test]
fn every_metric_is_documented_with_its_type_and_labels_and_every_documented_one_exists() {
    let doc = read(&root().join("docs/metrics.md"));
    let rows = table_rows(&doc, "metric");
    assert!(
        !rows.is_empty(),
        "docs/metrics.md has no table whose first column is `metric`"
    );
    // Documented name (without the prefix) -> (line, type, labels cell).
    let mut documented: BTreeMap<String, (usize, String, String)> = BTreeMap::new();
    for (line, row) in &rows {
        let names = code_spans(&row[0]);
        assert!(
            !names.is_empty() && row.len() >= 3,
            "docs/metrics.md:{line}: a row is `name` | type | labels"
        );
        for name in names {
            let again =
                documented.insert(name.to_string(), (*line, row[1].clone(), row[2].clone()));
            assert!(
                again.is_none(),
                "docs/metrics.md:{line}: {name} documented twice"
            );
        }
    }
    let mut problems = Vec::new();
    let registered = Metrics::new().described();
    assert!(!registered.is_empty());
    for m in &registered {
        let name = m
            .name
            .strip_prefix("watchrelay_")
            .unwrap_or_else(|| panic!("{} lacks the watchrelay_ prefix", m.name));
        let Some((line, kind, labels)) = documented.remove(name) else {
            problems.push(format!(
                "{} ({}) is registered but not documented",
                m.name, m.kind
            ));
            continue;
        };
        if kind != m.kind {
            problems.push(format!(
                "docs/metrics.md:{line}: {name} is a {}, documented as {kind:?}",
                m.kind
            ));
        }
        let words: BTreeSet<&str> = labels
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .collect();
        for label in &m.labels {
            if !words.contains(label.as_str()) {
                problems.push(format!(
                    "docs/metrics.md:{line}: {name} has the label {label}, not documented"
                ));
            }
        }
        if m.labels.is_empty() != labels.starts_with("(none)") {
            problems.push(format!(
                "docs/metrics.md:{line}: {name} has the labels {:?}: its labels cell starts with \
                 \"(none)\" exactly when it has none",
                m.labels
            ));
        }
    }
    for (name, (line, _, _)) in documented {
        problems.push(format!(
            "docs/metrics.md:{line}: {name} is documented but not registered"
        ));
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn every_alert_rule_is_documented() {
    let doc = read(&root().join("docs/metrics.md"));
    let documented: BTreeSet<String> = table_rows(&doc, "alert")
        .iter()
        .flat_map(|(_, row)| code_spans(&row[0]).into_iter().map(str::to_string))
        .collect();
    let rules = read(&root().join("deploy/prometheus-rules.yaml"));
    let defined: BTreeSet<String> = rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert:"))
        .map(|name| name.trim().to_string())
        .collect();
    assert!(
        !defined.is_empty(),
        "no alert in deploy/prometheus-rules.yaml"
    );
    let undocumented: Vec<_> = defined.difference(&documented).collect();
    let unknown: Vec<_> = documented.difference(&defined).collect();
    assert!(
        undocumented.is_empty() && unknown.is_empty(),
        "the alerts of deploy/prometheus-rules.yaml and of docs/metrics.md differ:\n  \
         defined but not documented: {undocumented:?}\n  documented but not defined: {unknown:?}"
    );
}

/// Every alert links its runbook: a section of docs/operations.md named after it.
#[test]
fn every_alert_links_its_runbook_section() {
    let runbook = read(&root().join("docs/operations.md"));
    let anchors: BTreeSet<String> = runbook
        .lines()
        .filter_map(|l| l.strip_prefix("### "))
        .map(slug)
        .collect();
    let rules = read(&root().join("deploy/prometheus-rules.yaml"));
    let mut alert = None;
    let mut linked = BTreeSet::new();
    for line in rules.lines().map(str::trim) {
        if let Some(name) = line.strip_prefix("- alert:") {
            alert = Some(name.trim().to_string());
        }
        if let Some(url) = line.strip_prefix("runbook_url:") {
            let name = alert.clone().expect("a runbook_url inside an alert");
            let anchor = url
                .trim()
                .trim_matches('"')
                .rsplit_once("docs/operations.md#");
            assert_eq!(
                anchor.map(|(_, a)| a.to_string()),
                Some(name.to_lowercase()),
                "{name}: {url}"
            );
            assert!(
                anchors.contains(&name.to_lowercase()),
                "docs/operations.md has no runbook section for {name}"
            );
            linked.insert(name);
        }
    }
    let defined: BTreeSet<String> = rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert:"))
        .map(|name| name.trim().to_string())
        .collect();
    assert_eq!(linked, defined, "alerts without a runbook_url");
}

/// GitHub's anchor for a heading: lower case, punctuation dropped (hyphens and underscores
/// kept), spaces as hyphens.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// Every anchor a Markdown file offers: its headings' slugs (repeats numbered as GitHub does)
/// and the ids of its HTML anchors.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for (_, line) in prose(text) {
        let hashes = line.chars().take_while(|&c| c == '#').count();
        if (1..=6).contains(&hashes) && line[hashes..].starts_with(' ') {
            let base = slug(line[hashes..].trim_end_matches('#'));
            let n = seen.entry(base.clone()).or_insert(0);
            out.insert(if *n == 0 {
                base.clone()
            } else {
                format!("{base}-{n}")
            });
            *n += 1;
        }
        for attr in ["id=\"", "name=\""] {
            for part in line.split(attr).skip(1) {
                if let Some(id) = part.split('"').next() {
                    out.insert(id.to_string());
                }
            }
        }
    }
    out
}

/// A line without its code spans.
fn without_code(line: &str) -> String {
    line.split('`').step_by(2).collect::<Vec<_>>().join(" ")
}

/// The targets of the inline links of `text` (`[text](target)`, images included), with their
/// line numbers; code blocks and code spans left out.
fn links(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (n, line) in prose(text) {
        let line = without_code(line);
        let mut rest = line.as_str();
        while let Some(i) = rest.find("](") {
            rest = &rest[i + 2..];
            let end = rest.find(')').unwrap_or(rest.len());
            let target = rest[..end].split_whitespace().next().unwrap_or("");
            out.push((n, target.trim_matches(['<', '>']).to_string()));
            rest = &rest[end..];
        }
    }
    out
}

/// Every file under `dir` whose name ends with `suffix`, build output, caches and hidden
/// folders left out.
fn files(dir: &Path, suffix: &str, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("a directory entry").path())
        .collect();
    entries.sort();
    for path in entries {
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if path.is_dir() {
            if !(name.starts_with('.') || name == "target" || name == "node_modules") {
                files(&path, suffix, out);
            }
        } else if name.ends_with(suffix) {
            out.push(path);
        }
    }
}

#[test]
fn every_relative_link_of_the_markdown_files_resolves() {
    let mut markdown = Vec::new();
    files(root(), ".md", &mut markdown);
    assert!(markdown.iter().any(|p| p.ends_with("docs/delivery.md")));
    let mut broken = Vec::new();
    for file in &markdown {
        let text = read(file);
        let shown = file.strip_prefix(root()).unwrap_or(file).display();
        for (line, target) in links(&text) {
            if target.contains("://") || target.starts_with("mailto:") || target.is_empty() {
                continue;
            }
            let (path, anchor) = target.split_once('#').unwrap_or((&target, ""));
            let resolved = if path.is_empty() {
                file.clone()
            } else {
                file.parent().expect("a file's folder").join(path)
            };
            if !resolved.exists() {
                broken.push(format!("{shown}:{line}: {target}: no such file"));
                continue;
            }
            if anchor.is_empty() {
                continue;
            }
            if resolved.extension().and_then(|e| e.to_str()) != Some("md") {
                broken.push(format!(
                    "{shown}:{line}: {target}: an anchor into a non-Markdown file"
                ));
                continue;
            }
            if !anchors(&read(&resolved)).contains(anchor) {
                broken.push(format!(
                    "{shown}:{line}: {target}: no heading with that anchor"
                ));
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn every_page_of_the_docs_named_outside_them_exists() {
    let mut named = Vec::new();
    for dir in [
        "src", "charts", "deploy", "scripts", "tests", "benches", "sim", ".ci",
    ] {
        let dir = root().join(dir);
        if dir.is_dir() {
            files(&dir, "", &mut named);
        }
    }
    let mut missing = Vec::new();
    for file in named {
        let Ok(text) = std::fs::read_to_string(&file) else {
            continue;
        };
        let mut rest = text.as_str();
        while let Some(i) = rest.find("docs/") {
            rest = &rest[i + "docs/".len()..];
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
                .collect();
            if let Some(page) = name
                .strip_suffix(".md")
                .or_else(|| name.find(".md").map(|end| &name[..end]))
            {
                if !root().join("docs").join(format!("{page}.md")).is_file() {
                    missing.push(format!(
                        "{}: docs/{page}.md",
                        file.strip_prefix(root()).unwrap_or(&file).display()
                    ));
                }
            }
        }
    }
    assert!(
        missing.is_empty(),
        "pages named but missing:\n{}",
        missing.join("\n")
    );
}
