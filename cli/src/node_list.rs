//! `quotient node list [--limit N [--page-token T]] [-o json]`: the GPU hosts, their state
//! and their GPUs, sorted by name in natural order: runs of digits compare as numbers, so
//! node-2 comes before node-10. The coordinators answer a page of at most 1,000 nodes at a
//! time; without `--limit` every page is read and the whole list printed (a JSON array).

use std::cmp::Ordering;

use quotient_common::api::{ApiRequest, ApiResponse, NodePage, NodeView, NODE_PAGE_MAX};
use quotient_common::ErrorCode;

use crate::client::{unexpected, Session};
use crate::failure::RequestFailed;
use crate::output::{self, OutputFormat};
use crate::GlobalArgs;

/// Arguments of `quotient node list`.
#[derive(Debug, clap::Args)]
pub struct NodeListArgs {
    /// Only one page of this many nodes, by name, 1-1000; stderr says how to ask for the
    /// next [default: every node, read a page at a time].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=NODE_PAGE_MAX as i64))]
    pub limit: Option<u32>,
    /// The page after the one that gave this token (with --limit).
    #[arg(long, value_name = "TOKEN", requires = "limit")]
    pub page_token: Option<String>,
}

/// One page of nodes.
fn page(session: &mut Session, limit: u32, page_token: Option<String>) -> anyhow::Result<NodePage> {
    let request = ApiRequest::ListNodes { limit, page_token };
    match session.call(request.clone())? {
        ApiResponse::Nodes(page) => Ok(page),
        other => Err(unexpected(&request, &other)),
    }
}

/// Reads every node, a page at a time, sorted by name ([`natural_order`]).
pub fn fetch_all(session: &mut Session) -> anyhow::Result<Vec<NodeView>> {
    let mut nodes = Vec::new();
    let mut token = None;
    loop {
        let page = page(session, NODE_PAGE_MAX, token)?;
        nodes.extend(page.nodes);
        match page.next_page_token {
            Some(next) => token = Some(next),
            None => break,
        }
    }
    nodes.sort_by(|a, b| natural_order(&a.name, &b.name));
    Ok(nodes)
}

/// Compares names in natural order: runs of ASCII digits compare as numbers (`node-2` before
/// `node-10`), everything else character by character; names equal that way (`n01`, `n1`)
/// fall back to plain order.
pub fn natural_order(a: &str, b: &str) -> Ordering {
    let (mut left, mut right) = (a.as_bytes(), b.as_bytes());
    loop {
        match (left.first(), right.first()) {
            (None, None) => return a.cmp(b),
            (None, Some(_)) => return Ordering::Less,
            (Some(_), None) => return Ordering::Greater,
            (Some(x), Some(y)) if x.is_ascii_digit() && y.is_ascii_digit() => {
                let digits = |text: &[u8]| text.iter().take_while(|c| c.is_ascii_digit()).count();
                let (n, m) = (digits(left), digits(right));
                let strip = |run: &[u8]| {
                    let zeros = run.iter().take_while(|c| **c == b'0').count();
                    run[zeros..].to_vec()
                };
                let (x_run, y_run) = (strip(&left[..n]), strip(&right[..m]));
                let by_number = x_run
                    .len()
                    .cmp(&y_run.len())
                    .then_with(|| x_run.cmp(&y_run));
                if by_number != Ordering::Equal {
                    return by_number;
                }
                left = &left[n..];
                right = &right[m..];
            }
            (Some(x), Some(y)) => {
                if x != y {
                    return x.cmp(y);
                }
                left = &left[1..];
                right = &right[1..];
            }
        }
    }
}

/// Reads one node by name (for cordon, uncordon and drain to print the result).
pub fn fetch(session: &mut Session, name: &str) -> anyhow::Result<NodeView> {
    fetch_all(session)?
        .into_iter()
        .find(|node| node.name == name)
        .ok_or_else(|| {
            RequestFailed::error(
                ErrorCode::NotFound,
                format!("node {name} is not in `quotient node list`"),
            )
        })
}

pub fn run(global: &GlobalArgs, args: &NodeListArgs) -> anyhow::Result<()> {
    let mut session = Session::open(global.config.as_deref())?;
    let nodes = match args.limit {
        None => fetch_all(&mut session)?,
        Some(limit) => {
            // One page, in the coordinators' order (by name, byte for byte).
            let page = page(&mut session, limit, args.page_token.clone())?;
            if let Some(token) = &page.next_page_token {
                eprintln!(
                    "more nodes: `quotient node list --limit {limit} --page-token {token}` shows \
                     the next {limit}"
                );
            }
            page.nodes
        }
    };
    match global.output {
        OutputFormat::Table | OutputFormat::Csv => output::print_text(&output::node_table(&nodes)),
        OutputFormat::Json => output::print_json(&nodes),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_sort_in_natural_order() {
        // Proves node-2 before node-10, letters by character, and a total order.
        let mut names = vec![
            "node-10", "node-2", "gpu-a", "node-1", "node-02", "b", "node-1a",
        ];
        names.sort_by(|a, b| natural_order(a, b));
        assert_eq!(
            names,
            ["b", "gpu-a", "node-1", "node-1a", "node-02", "node-2", "node-10"]
        );
    }
}
