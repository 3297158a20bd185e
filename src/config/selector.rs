//! Offline checks of the selectors a channel passes to the API server, so that a typo is a
//! configuration error naming the field instead of a 400 retried at run time. The grammar is
//! the API server's (`k8s.io/apimachinery/pkg/labels` and `pkg/fields`).

use super::syntax::is_dns_subdomain;

/// Checks a label selector: comma-separated requirements `key`, `!key`, `key=value`,
/// `key==value`, `key!=value`, `key>N`, `key<N`, `key in (v1,v2)`, `key notin (v1,v2)`. An
/// empty selector selects everything.
pub(crate) fn label_selector(s: &str) -> Result<(), String> {
    if s.trim().is_empty() {
        return Ok(());
    }
    for requirement in split_top(s)? {
        let r = requirement.trim();
        if r.is_empty() {
            return Err("an empty requirement (a stray comma?)".into());
        }
        if let Some(key) = r.strip_prefix('!') {
            label_key(key.trim())?;
            continue;
        }
        if let Some((key, values)) = set_requirement(r) {
            label_key(key)?;
            let values = values
                .strip_prefix('(')
                .and_then(|v| v.strip_suffix(')'))
                .ok_or_else(|| format!("{r:?}: the values of in and notin go in parentheses"))?;
            for v in values.split(',') {
                label_value(v.trim())?;
            }
            continue;
        }
        match operator(r) {
            Some((key, op, value)) => {
                label_key(key)?;
                if matches!(op, ">" | "<") {
                    value
                        .parse::<i64>()
                        .map_err(|_| format!("{r:?}: {op} compares with an integer"))?;
                } else {
                    label_value(value)?;
                }
            }
            None => label_key(r)?,
        }
    }
    Ok(())
}

/// Checks a field selector: comma-separated `field=value`, `field==value` or `field!=value`
/// (a `\\,` in a value is a comma; empty terms are skipped, as the API server skips them). The
/// field itself is the API server's to know.
pub(crate) fn field_selector(s: &str) -> Result<(), String> {
    for r in split_unescaped(s) {
        let r = r.trim();
        if r.is_empty() {
            continue;
        }
        let field = match operator(r) {
            Some((field, "=" | "==" | "!=", _)) => field,
            _ => {
                return Err(format!(
                    "{r:?}: a field requirement is field=value, field==value or field!=value"
                ))
            }
        };
        if field.is_empty() || field.contains(char::is_whitespace) {
            return Err(format!(
                "{field:?} is not a field path (such as status.phase)"
            ));
        }
    }
    Ok(())
}

/// `s` split at the commas no backslash escapes.
fn split_unescaped(s: &str) -> Vec<&str> {
    let (mut out, mut start, mut escaped) = (Vec::new(), 0, false);
    for (i, c) in s.char_indices() {
        match c {
            '\\' if !escaped => escaped = true,
            ',' if !escaped => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => escaped = false,
        }
    }
    out.push(&s[start..]);
    out
}

/// The requirements of a selector, split at the commas outside parentheses.
fn split_top(s: &str) -> Result<Vec<&str>, String> {
    let (mut depth, mut start, mut out) = (0i32, 0, Vec::new());
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
        if !(0..=1).contains(&depth) {
            return Err(format!("{s:?}: unbalanced parentheses"));
        }
    }
    if depth != 0 {
        return Err(format!("{s:?}: unbalanced parentheses"));
    }
    out.push(&s[start..]);
    Ok(out)
}

/// `key in (...)` or `key notin (...)`: the key and the parenthesised values. Only a key
/// without an operator followed by the word and a parenthesis is one (`env= internal` is not).
fn set_requirement(r: &str) -> Option<(&str, &str)> {
    let (key, rest) = r.split_once(char::is_whitespace)?;
    if key.contains(['=', '!', '<', '>']) {
        return None;
    }
    let rest = rest.trim_start();
    let values = rest
        .strip_prefix("notin")
        .or_else(|| rest.strip_prefix("in"))?
        .trim();
    values.starts_with('(').then_some((key, values))
}

/// `key op value` for `=`, `==`, `!=`, `>` and `<`: the key, the operator and the value.
fn operator(r: &str) -> Option<(&str, &str, &str)> {
    let at = r.find(['=', '!', '<', '>'])?;
    let (key, rest) = r.split_at(at);
    let op = ["!=", "==", "=", ">", "<"]
        .into_iter()
        .find(|op| rest.starts_with(op))?;
    Some((key.trim(), op, rest[op.len()..].trim()))
}

/// A label key: an optional DNS-subdomain prefix and `/`, then a name.
fn label_key(key: &str) -> Result<(), String> {
    let name = match key.split_once('/') {
        Some((prefix, name)) => {
            if !is_dns_subdomain(prefix) {
                return Err(format!(
                    "{key:?}: the prefix of a label key is a DNS subdomain"
                ));
            }
            name
        }
        None => key,
    };
    if name.is_empty() || !label_value_chars(name) {
        return Err(format!(
            "{key:?} is not a label key (at most 63 letters, digits, '-', '_' or '.', beginning and ending with a letter or digit)"
        ));
    }
    Ok(())
}

fn label_value(value: &str) -> Result<(), String> {
    if value.is_empty() || label_value_chars(value) {
        Ok(())
    } else {
        Err(format!(
            "{value:?} is not a label value (at most 63 letters, digits, '-', '_' or '.', beginning and ending with a letter or digit)"
        ))
    }
}

fn label_value_chars(s: &str) -> bool {
    let ends = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    s.len() <= 63
        && ends(s.chars().next())
        && ends(s.chars().last())
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_selectors_the_api_server_accepts_pass() {
        for ok in [
            "app",
            "!app",
            "app=web",
            "app==web",
            "app!=web",
            "tier in (a, b)",
            "tier notin (a)",
            "team=x,env in (prod,staging),!legacy",
            "example.com/team=x",
            "app=",
            "tier!= infra",
            "env= internal",
            "env== in-house",
            "replicas>1",
            "replicas < 3",
            "tier in(a)",
            "",
        ] {
            assert_eq!(label_selector(ok), Ok(()), "{ok}");
        }
    }

    #[test]
    fn malformed_label_selectors_are_refused() {
        for bad in [
            "team in (a",
            "app==,=x",
            "app=web,",
            "tier in a,b",
            "app=we b",
            "-app=x",
            "Bad_Prefix!/x=y",
            "replicas>one",
            "app in",
        ] {
            assert!(label_selector(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn field_selectors_need_an_operator() {
        assert_eq!(field_selector("status.phase=Running"), Ok(()));
        assert_eq!(field_selector("metadata.name!=x,spec.nodeName=n"), Ok(()));
        assert_eq!(
            field_selector(r"spec.my_field=a\,b,"),
            Ok(()),
            "escaped comma, empty term"
        );
        assert_eq!(field_selector(""), Ok(()));
        assert!(field_selector("status.phase").is_err());
        assert!(field_selector("=x").is_err());
    }
}
