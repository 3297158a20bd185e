//! The documentation against the code: it fails when either drifts from the other.
//!
//! - Every configuration field the file accepts ([`watchrelay::config::field_paths`]) is a row
//!   of the field table in `docs/configuration.md`, and every row there is a field it accepts.

use std::collections::BTreeSet;
use std::path::Path;

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
