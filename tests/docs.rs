//! The documentation against the code: it fails when either drifts from the other.
//!
//! - Every configuration field the file accepts ([`watchrelay::config::field_paths`]) is a row
//!   of the field table in `docs/configuration.md`, and every row there is a field it accepts.
//! - Every metric the relay registers ([`watchrelay::metrics::Metrics::described`]) is a row of
//!   the metric table in `docs/metrics.md`, with its type and its labels, and every row there is
//!   a registered metric; every alert of `deploy/prometheus-rules.yaml` is in its alert table.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

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
