//! Collection routes: `GET` of a collection as a list (paginated, at a consistent snapshot,
//! with continue tokens) or as a watch (`?watch=true`, streamed by `crate::watch`), and their
//! query parameters (selectors, resourceVersion, pagination, watch options).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use http::Response;
use serde_json::{json, Value};

use crate::resources::Resource;
use crate::selector::Selector;
use crate::shards::ShardSelector;
use crate::state::Inner;
use crate::watch::{self, Params, Start};
use crate::wire::{error, json_response, Body, Query};
use crate::SimError;

/// `GET` a collection with `?watch=true`: a chunked stream of watch events.
pub(super) fn watch(
    inner: &Arc<Inner>,
    res: &Resource,
    ns: Option<&str>,
    query: &Query,
) -> Response<Body> {
    let current = inner.store.lock().expect("store lock poisoned").rv;
    match watch_params(inner, res, ns, query).and_then(|p| {
        // A position the server has not reached (an etcd restore, a copied checkpoint):
        // the API server gives up waiting for it with 504.
        let lagging = || {
            let mut lag = inner
                .faults
                .lag_watches
                .lock()
                .expect("faults lock poisoned");
            match lag.as_mut() {
                Some((r, n)) if *r == res.plural && *n > 0 => {
                    *n -= 1;
                    true
                }
                _ => false,
            }
        };
        match p.start {
            Start::Exact(rv) if rv > current || lagging() => Err(SimError::new(
                504,
                "Timeout",
                format!("Too large resource version: {rv}, current: {current}"),
            )),
            _ => Ok(p),
        }
    }) {
        Ok(p) => Response::builder()
            .status(200)
            .header("content-type", "application/json")
            .header("transfer-encoding", "chunked")
            .body(watch::start(inner.clone(), p))
            .expect("static parts are valid"),
        Err(e) => error(&e),
    }
}

/// `GET` a collection: one page of the list, counted and delayed as configured.
pub(super) async fn list(
    inner: &Inner,
    res: &Resource,
    ns: Option<&str>,
    query: &Query,
) -> Response<Body> {
    let _counted = inner.requests.list(query.get("limit").is_some());
    if !inner.cfg.list_delay.is_zero() {
        tokio::time::sleep(inner.cfg.list_delay).await;
    }
    let page = list_page(inner, res, ns, query).unwrap_or_else(|e| error(&e));
    let faults = &inner.faults;
    let hold = {
        let mut h = faults.hold_list.lock().expect("faults lock poisoned");
        h.take_if(|r| *r == res.plural).is_some()
    };
    if hold {
        faults.holding.store(true, Ordering::SeqCst);
        faults.release.notified().await;
        faults.holding.store(false, Ordering::SeqCst);
    }
    page
}

fn parse_rv(s: &str) -> Result<u64, SimError> {
    s.parse()
        .map_err(|_| SimError::bad_request(format!("invalid resourceVersion {s:?}")))
}

fn selectors(q: &Query) -> Result<(Selector, Selector), SimError> {
    let param = |k: &str| q.get(k);
    let labels =
        Selector::parse(param("labelSelector").unwrap_or("")).map_err(SimError::bad_request)?;
    let fields =
        Selector::parse(param("fieldSelector").unwrap_or("")).map_err(SimError::bad_request)?;
    fields.check_fields().map_err(SimError::bad_request)?;
    Ok((labels, fields))
}

/// The request's `shardSelector`, where the gate is on (ignored where it is off).
fn shard_selector(inner: &Inner, q: &Query) -> Result<Option<ShardSelector>, SimError> {
    match q.get("shardSelector") {
        // kube-apiserver 1.37 answers a malformed selector with a 500 without a reason.
        Some(s) if inner.cfg.sharded_list_and_watch => ShardSelector::parse(s)
            .map(Some)
            .map_err(|e| SimError::new(500, "", format!("invalid shard selector: {e}"))),
        _ => Ok(None),
    }
}

fn watch_params(
    inner: &Inner,
    res: &Resource,
    ns: Option<&str>,
    q: &Query,
) -> Result<Params, SimError> {
    let watch_list = inner.cfg.watch_list;
    let (labels, fields) = selectors(q)?;
    let shards = shard_selector(inner, q)?;
    let param = |k: &str| q.get(k);
    let bookmarks = matches!(param("allowWatchBookmarks"), Some("true" | "1"));
    let send_initial = matches!(param("sendInitialEvents"), Some("true" | "1"));
    let rv = param("resourceVersion").unwrap_or("");
    let start = if send_initial {
        if !watch_list {
            return Err(SimError::invalid(
                "sendInitialEvents: Forbidden: sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled",
            ));
        }
        // Without allowWatchBookmarks the initial state still arrives, with no end marker
        // (as kube-apiserver 1.37 answers).
        if param("resourceVersionMatch") != Some("NotOlderThan") {
            return Err(SimError::invalid(
                "sendInitialEvents requires resourceVersionMatch=NotOlderThan",
            ));
        }
        Start::Current
    } else if rv.is_empty() || rv == "0" {
        Start::Current
    } else {
        Start::Exact(parse_rv(rv)?)
    };
    let timeout = param("timeoutSeconds")
        .and_then(|t| t.parse::<u64>().ok())
        .map(Duration::from_secs);
    Ok(Params {
        resource: res.key(),
        kind: res.kind.clone(),
        api_version: res.api_version(),
        namespace: ns.map(str::to_string),
        labels,
        fields,
        shards,
        start,
        bookmarks,
        initial_events_end: send_initial && bookmarks,
        timeout,
    })
}

fn encode_continue(rv: u64, ns: &str, name: &str) -> String {
    format!("{rv}:{ns}:{name}")
        .bytes()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn decode_continue(token: &str) -> Option<(u64, String, String)> {
    let bytes: Option<Vec<u8>> = (0..token.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(token.get(i..i + 2)?, 16).ok())
        .collect();
    let s = String::from_utf8(bytes?).ok()?;
    let mut parts = s.splitn(3, ':');
    Some((
        parts.next()?.parse().ok()?,
        parts.next()?.to_string(),
        parts.next()?.to_string(),
    ))
}

/// One page of the list: the first, or the one a continue token points at.
fn list_page(
    inner: &Inner,
    res: &Resource,
    ns: Option<&str>,
    q: &Query,
) -> Result<Response<Body>, SimError> {
    let (labels, fields) = selectors(q)?;
    let shards = shard_selector(inner, q)?;
    let param = |k: &str| q.get(k);
    let limit = param("limit")
        .and_then(|l| l.parse::<usize>().ok())
        .filter(|l| *l > 0);
    let later_page = param("continue").is_some_and(|c| !c.is_empty());
    let fail = &inner.faults.fail_continued;
    if later_page
        && fail
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
            .is_ok()
    {
        return Err(SimError::new(
            500,
            "InternalError",
            "Internal error occurred: a later page failed, injected by the simulator",
        ));
    }
    let store = inner.store.lock().expect("store lock poisoned");
    let (snapshot, after) = match param("continue").filter(|c| !c.is_empty()) {
        Some(token) => {
            let (rv, ns, name) = decode_continue(token)
                .ok_or_else(|| SimError::bad_request("invalid continue token"))?;
            (rv, Some((ns, name)))
        }
        None => {
            let rv = param("resourceVersion").unwrap_or("");
            let exact = param("resourceVersionMatch") == Some("Exact");
            if exact && !rv.is_empty() {
                (parse_rv(rv)?, None)
            } else {
                if !rv.is_empty() {
                    parse_rv(rv)?;
                }
                (store.rv, None)
            }
        }
    };
    let (page, more) =
        store.page_at(&res.key(), ns, Some(snapshot), after.as_ref(), limit, |o| {
            labels.matches_labels(o)
                && fields.matches_fields(o)
                && shards.as_ref().is_none_or(|s| s.matches(o))
        })?;
    drop(store);
    let cont = more.then(|| {
        let md = &page.last().expect("a page with more after it is not empty")["metadata"];
        let ns = md["namespace"].as_str().unwrap_or("");
        encode_continue(snapshot, ns, md["name"].as_str().unwrap_or(""))
    });
    let items: Vec<&Value> = page.iter().map(|o| &**o).collect();
    let mut md = json!({ "resourceVersion": snapshot.to_string() });
    if let Some(c) = cont {
        md["continue"] = c.into();
    }
    if let Some(s) = &shards {
        md["shardInfo"] = json!({ "selector": s.text() });
    }
    Ok(json_response(
        200,
        &json!({ "kind": format!("{}List", res.kind), "apiVersion": res.api_version(), "metadata": md, "items": items }),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn continue_tokens_round_trip() {
        let t = encode_continue(42, "ns-a", "pod:1");
        assert_eq!(
            decode_continue(&t),
            Some((42, "ns-a".into(), "pod:1".into()))
        );
        assert_eq!(decode_continue("zz"), None);
    }
}
