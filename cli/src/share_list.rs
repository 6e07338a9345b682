//! `quotient share list [-o json]`: every share with its limits, usage, borrowing and jobs.

use quotient_common::api::{ApiRequest, ApiResponse, ShareView};
use quotient_common::ErrorCode;

use crate::client::{unexpected, Session};
use crate::failure::RequestFailed;
use crate::output::{self, OutputFormat};
use crate::GlobalArgs;

/// Arguments of `quotient share list` (none besides the global ones).
#[derive(Debug, clap::Args)]
pub struct ShareListArgs {}

/// Most edits between a name given and a share's name for "did you mean" to offer it.
pub const SUGGESTION_DISTANCE_MAX: usize = 2;

/// Reads every share.
pub fn fetch_all(session: &mut Session) -> anyhow::Result<Vec<ShareView>> {
    let request = ApiRequest::ListShares;
    match session.call(request.clone())? {
        ApiResponse::Shares(shares) => Ok(shares),
        other => Err(unexpected(&request, &other)),
    }
}

/// The edit (Levenshtein) distance between two names, in characters.
pub fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut previous: Vec<usize> = (0..=b.len()).collect();
    for (i, left) in a.chars().enumerate() {
        let mut current = vec![i + 1];
        for (j, right) in b.iter().enumerate() {
            let substitution = previous[j] + usize::from(left != *right);
            current.push(substitution.min(previous[j + 1] + 1).min(current[j] + 1));
        }
        previous = current;
    }
    previous[b.len()]
}

/// The name in `names` nearest to `given`, if one is near: at most
/// [`SUGGESTION_DISTANCE_MAX`] edits away, or starting with it or it with them (the nearest
/// first, then the first in order).
pub fn nearest<'a>(given: &str, names: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    names
        .into_iter()
        .filter(|name| *name != given)
        .map(|name| (edit_distance(given, name), name))
        .filter(|(distance, name)| {
            *distance <= SUGGESTION_DISTANCE_MAX
                || name.starts_with(given)
                || given.starts_with(*name)
        })
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, name)| name)
}

/// The error for a share `name` that does not exist, with "did you mean" when a share of a
/// near name does (the shares are listed to find it; a failed listing only loses the hint).
pub fn unknown_share(session: &mut Session, name: &str) -> anyhow::Error {
    let shares = fetch_all(session).unwrap_or_default();
    let near = nearest(name, shares.iter().map(|share| share.name.as_str()));
    let message = match near {
        Some(near) => format!(
            "no share named {name}: did you mean {near}? `quotient share list` shows the shares"
        ),
        None => format!("no share named {name}; `quotient share list` shows the shares"),
    };
    RequestFailed::error(ErrorCode::NotFound, message)
}

/// Whether a share named `name` exists; a share of that name is not an error, a missing one
/// is [`unknown_share`]'s.
pub fn require(session: &mut Session, name: &str) -> anyhow::Result<()> {
    let shares = fetch_all(session)?;
    if shares.iter().any(|share| share.name == name) {
        return Ok(());
    }
    Err(unknown_share(session, name))
}

pub fn run(global: &GlobalArgs, _args: &ShareListArgs) -> anyhow::Result<()> {
    let mut session = Session::open(global.config.as_deref())?;
    let shares = fetch_all(&mut session)?;
    match global.output {
        OutputFormat::Table | OutputFormat::Csv => {
            output::print_text(&output::share_table(&shares))
        }
        OutputFormat::Json => output::print_json(&shares),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn near_names_are_suggested_and_far_ones_are_not() {
        // Proves the "did you mean" rule: 2 edits at most, or a prefix either way.
        assert_eq!(edit_distance("qs1", "qs1"), 0);
        assert_eq!(edit_distance("qs", "qs1"), 1);
        assert_eq!(edit_distance("tema", "team"), 2);
        assert_eq!(edit_distance("", "abc"), 3);
        let names = ["team-a", "qs1", "research"];
        assert_eq!(nearest("qs2", names), Some("qs1"));
        assert_eq!(nearest("team", names), Some("team-a"));
        assert_eq!(nearest("reserch", names), Some("research"));
        assert_eq!(nearest("nosuch", names), None);
        assert_eq!(nearest("qs1", ["qs1"]), None);
    }
}
