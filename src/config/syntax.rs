//! The forms a value must take, checked wherever the configuration names one: Kubernetes
//! names, and `${NAME}` in a value.

/// Replaces `${NAME}` with the variable's value; `$${` stands for a literal `${`.
pub(super) fn expand_env(
    value: &str,
    env: impl Fn(&str) -> Option<String>,
) -> Result<String, String> {
    let mut out = String::with_capacity(value.len());
    let mut rest = value;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        rest = &rest[i..];
        if let Some(after) = rest.strip_prefix("$${") {
            out.push_str("${");
            rest = after;
        } else if let Some(after) = rest.strip_prefix("${") {
            let end = after
                .find('}')
                .ok_or("unterminated ${ (write $${ for a literal ${)")?;
            let name = &after[..end];
            let valid = name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            if !valid {
                return Err(format!("${{{name}}} is not an environment variable name"));
            }
            out.push_str(
                &env(name).ok_or_else(|| format!("environment variable {name} is not set"))?,
            );
            rest = &after[end + 1..];
        } else {
            out.push('$');
            rest = &rest[1..];
        }
    }
    out.push_str(rest);
    Ok(out)
}

/// A DNS label (RFC 1123): a namespace's or a cluster's name.
pub(crate) fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// A DNS subdomain (RFC 1123): most objects' names.
pub(crate) fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(is_dns_label)
}
