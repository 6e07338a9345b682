//! The command line's synchronous wrapper around the one API client (`quotient-client`):
//! [`Session`] loads the client config, drives an [`ApiClient`] on a small tokio runtime so
//! that command modules stay synchronous, and turns a failed call into a [`RequestFailed`]
//! that keeps its code and says, in this command line's words, what to do.
//!
//! How the leader is found, what is retried and within which deadlines is the client's
//! (`quotient_client::ApiClient`); this module only adds the hints ([`hint`]), because the
//! coordinators' texts name no command of this program.

use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use quotient_client::{ApiClient, ClientError, RetryPolicy};
use quotient_common::api::{ApiError, ApiRequest, ApiResponse, JobPage};
use quotient_common::tls::TlsIdentity;
use quotient_common::{ErrorCode, Rejection};

use crate::client_config::{self, ClientConfig};
use crate::failure::RequestFailed;

/// How long a finished session waits for its close frames to leave (milliseconds).
pub const CLOSE_FLUSH_MS: u64 = 10;

/// A connected client for synchronous command code: the config's coordinators, the client and
/// a small runtime to drive it.
pub struct Session {
    client: ApiClient,
    runtime: tokio::runtime::Runtime,
}

impl Session {
    /// Finds the client config (`--config`, `$QUOTIENT_CONFIG`, `~/.config/quotient`) and
    /// loads its certificates.
    pub fn open(config_flag: Option<&Path>) -> anyhow::Result<Session> {
        let config = client_config::load(config_flag)?;
        Session::from_config(&config)
    }

    /// A session for the coordinators and certificates of `config`.
    pub fn from_config(config: &ClientConfig) -> anyhow::Result<Session> {
        let identity = TlsIdentity::load(&config.tls_files())
            .context("cannot load the certificate named by the client config")?;
        warn_if_expiring(&config.tls_files().cert);
        let client = ApiClient::with_identity(config.coordinators.clone(), identity)
            .context("the client config lists no coordinators")?
            .with_cluster(config.cluster_id)
            .with_policy(RetryPolicy {
                fail_fast_unreachable: true,
                ..RetryPolicy::default()
            });
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("cannot start the async runtime")?;
        Ok(Session { client, runtime })
    }

    /// Replaces the retry policy (dev up waits less per probe, as it polls, and for
    /// coordinators still starting).
    pub fn with_policy(mut self, policy: RetryPolicy) -> Self {
        self.client = self.client.clone().with_policy(policy);
        self
    }

    /// The coordinators the config lists.
    pub fn addresses(&self) -> &[String] {
        self.client.addresses()
    }

    /// Sends `request` to the cluster (following redirects) and returns its answer, or the
    /// failure with its code and what to do.
    pub fn call(&mut self, request: ApiRequest) -> anyhow::Result<ApiResponse> {
        let answer = self.runtime.block_on(self.client.call(request.clone()));
        answer.map_err(|error| failed(&request, &error))
    }

    /// One page of jobs as full as its limit asks ([`quotient_client::ApiClient::job_page`]).
    pub fn job_page(&mut self, first: ApiRequest) -> anyhow::Result<JobPage> {
        let answer = self.runtime.block_on(self.client.job_page(first.clone()));
        answer.map_err(|error| failed(&first, &error))
    }

    /// Every job `first` and the pages after it list, newest first.
    pub fn every_job(
        &mut self,
        first: ApiRequest,
    ) -> anyhow::Result<Vec<quotient_common::api::JobView>> {
        let answer = self.runtime.block_on(self.client.every_job(first.clone()));
        answer.map_err(|error| failed(&first, &error))
    }

    /// Sends `request` to the coordinator at `address` only: no redirects, no retries (for
    /// `Health`, which is about the coordinator that answers).
    pub fn call_one(&mut self, address: &str, request: ApiRequest) -> anyhow::Result<ApiResponse> {
        let deadline = self.client.policy().attempt_deadline;
        self.call_one_within(address, request, deadline)
    }

    /// [`Session::call_one`] with a deadline of its own (`cluster init` waits for the other
    /// coordinators to catch up).
    pub fn call_one_within(
        &mut self,
        address: &str,
        request: ApiRequest,
        deadline: Duration,
    ) -> anyhow::Result<ApiResponse> {
        let answer =
            self.runtime
                .block_on(self.client.call_one(address, request.clone(), deadline));
        answer.map_err(|error| failed(&request, &error))
    }

    /// Sends `request` to each of `addresses` at once, each within `deadline`, without
    /// redirects or retries; the answers in the order of `addresses`.
    pub fn call_each(
        &mut self,
        addresses: &[String],
        request: &ApiRequest,
        deadline: Duration,
    ) -> Vec<anyhow::Result<ApiResponse>> {
        let calls = addresses.iter().map(|address| {
            let client = self.client.clone();
            let request = request.clone();
            let address = address.clone();
            async move {
                client
                    .call_one(&address, request.clone(), deadline)
                    .await
                    .map_err(|error| failed(&request, &error))
            }
        });
        let handles: Vec<_> = {
            let _entered = self.runtime.enter();
            calls.map(tokio::spawn).collect()
        };
        self.runtime.block_on(async move {
            let mut answers = Vec::with_capacity(handles.len());
            for handle in handles {
                answers.push(handle.await.unwrap_or_else(|error| {
                    Err(anyhow::anyhow!("the call did not complete: {error}"))
                }));
            }
            answers
        })
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        let _entered = self.runtime.enter();
        self.client.close();
        // Let the endpoint's driver send the close frames, so the coordinators drop these
        // connections now rather than after their idle timeout.
        self.runtime
            .block_on(tokio::time::sleep(Duration::from_millis(CLOSE_FLUSH_MS)));
    }
}

/// `error` of a call of `request` as a [`RequestFailed`]: its code, and its text with a hint
/// of what to do here, unless the text already names a command.
pub fn failed(request: &ApiRequest, error: &ClientError) -> anyhow::Error {
    let text = error.to_string();
    let message = match hint(request, error) {
        Some(hint) if !text.contains("`quotient ") => format!("{text}; {hint}"),
        _ => text,
    };
    anyhow::Error::new(RequestFailed {
        code: error.code(),
        retryable: error.retryable(),
        message,
    })
}

/// What to do about `error`, in commands of this program, by its code and what it refused.
pub fn hint(request: &ApiRequest, error: &ClientError) -> Option<String> {
    let retry = "retry, or check `quotient cluster status`";
    let hint = match error {
        ClientError::Api(ApiError::Rejected(rejection)) => rejection_hint(rejection)?,
        ClientError::Api(ApiError::Unauthorized(_)) if request.needs_admin() => {
            "point `cert` and `key` in the client config at an admin's certificate \
             (`quotient certs issue --role admin`)"
                .to_string()
        }
        ClientError::Api(ApiError::Unauthorized(_)) => {
            "point `cert` and `key` in the client config at a user's or an admin's certificate \
             (`quotient certs issue --role user`)"
                .to_string()
        }
        ClientError::Api(ApiError::NotFound(_)) => match request.unwrapped() {
            ApiRequest::RemoveMember { .. } => {
                "`quotient cluster status` shows the members".to_string()
            }
            _ => return None,
        },
        ClientError::Api(ApiError::Precondition(_)) => match request.unwrapped() {
            ApiRequest::RemoveNode { node } => {
                format!("once its agent is stopped, `quotient node remove {node}` again")
            }
            ApiRequest::InitCluster => {
                "`quotient cluster add-member` adds a coordinator to its cluster".to_string()
            }
            _ => return None,
        },
        ClientError::Api(ApiError::NotLeader { .. } | ApiError::Unavailable(_))
        | ClientError::Unavailable { .. } => retry.to_string(),
        ClientError::Api(ApiError::Stopped(_)) => {
            "`quotient cluster health` shows which coordinators serve; restart the stopped ones \
             once what their logs name is fixed"
                .to_string()
        }
        // One coordinator's health (`cluster health` asks each): that one is down, not the
        // cluster (found by probing: it was given the whole-cluster advice).
        ClientError::Unreachable { .. } if matches!(request.unwrapped(), ApiRequest::Health) => {
            "this coordinator is down or not at this address: its log says why it stopped; \
             the others serve while a majority is up"
                .to_string()
        }
        ClientError::Unreachable { .. } => {
            "check `coordinators` in the client config, or start a local cluster with \
             `quotient dev up`"
                .to_string()
        }
        ClientError::Uncertain(_) | ClientError::Api(ApiError::Uncertain(_)) => {
            "look before sending it again (`quotient job list`, `quotient share list`, \
             `quotient node list`)"
                .to_string()
        }
        _ => return None,
    };
    Some(hint)
}

/// The command that helps with a rejection, when one does.
fn rejection_hint(rejection: &Rejection) -> Option<String> {
    let hint = match rejection {
        Rejection::UnknownShare(_) => "`quotient share list` shows the shares".to_string(),
        Rejection::DuplicateShare(name) => {
            format!("`quotient share update {name}` changes the one there is")
        }
        Rejection::ShareEnabled(name) => {
            format!("`quotient share update {name} --state disabled` disables it")
        }
        Rejection::ShareDisabled(name) => {
            format!("`quotient share update {name} --state enabled` enables it")
        }
        Rejection::UnknownClass { .. } | Rejection::ClassRequired { .. } => {
            "pass `--gpu-class CLASS`".to_string()
        }
        Rejection::UnknownJob(_) => "`quotient job list` shows the jobs".to_string(),
        Rejection::JobRemoved(job) => {
            format!("`quotient job history --job {job}` shows its record")
        }
        Rejection::UnknownNode(_) => "`quotient node list` shows the nodes".to_string(),
        Rejection::UnknownGroup(_) => "`quotient group list` shows the groups".to_string(),
        Rejection::NotRevoked(_) => "`quotient certs revoked` lists what is revoked".to_string(),
        Rejection::UnknownAccessKey(_) => "`quotient access-key list` shows the keys".to_string(),
        Rejection::NodeReady(node) => format!(
            "`quotient node cordon {node}` (or `quotient node drain {node}` to move its jobs \
             off), stop its agent, then `quotient node remove {node}`"
        ),
        Rejection::NodeHasJobs { node, .. } => format!(
            "`quotient node drain {node}`, then `quotient node remove {node}` once `quotient \
             node list` shows none of its GPUs held"
        ),
        _ => return None,
    };
    Some(hint)
}

/// The error for an answer of the wrong kind (a version mismatch, or a coordinator bug).
pub fn unexpected(request: &ApiRequest, response: &ApiResponse) -> anyhow::Error {
    RequestFailed::error(
        ErrorCode::Internal,
        format!(
            "unexpected answer to {}: {response:?}; are this quotient and the coordinators the \
             same version?",
            request.unwrapped().name()
        ),
    )
}

/// Says on stderr when the certificate at `path` expires within
/// [`quotient_common::certs::EXPIRY_WARNING_DAYS`] days (or has expired).
fn warn_if_expiring(path: &std::path::Path) {
    let Ok(expires) = quotient_common::certs::expires_at(path) else {
        return;
    };
    let now = quotient_common::certs::unix_now_s();
    if let Some(warning) = expiry_warning(path, expires, now) {
        eprintln!("{warning}");
    }
}

/// The warning for a certificate expiring at `expires` (seconds since the epoch) seen at `now`.
pub fn expiry_warning(path: &std::path::Path, expires: i64, now: i64) -> Option<String> {
    let left = expires - now;
    let window = quotient_common::certs::EXPIRY_WARNING_DAYS as i64 * 86_400;
    let when = crate::output::rfc3339(u64::try_from(expires.max(0)).unwrap_or(0) * 1000);
    if left <= 0 {
        Some(format!(
            "warning: your certificate {} expired at {when}: get a new one (an admin issues it with `quotient certs issue`)",
            path.display()
        ))
    } else if left <= window {
        let days = (left + 86_399) / 86_400;
        Some(format!(
            "warning: your certificate {} expires at {when} (in {days} day{}): get a new one (an admin issues it with `quotient certs issue`)",
            path.display(),
            if days == 1 { "" } else { "s" }
        ))
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use quotient_common::JobSpec;

    fn text_of(request: &ApiRequest, error: ClientError) -> (ErrorCode, String) {
        let error = failed(request, &error);
        let failed = error
            .downcast_ref::<RequestFailed>()
            .expect("a RequestFailed");
        (failed.code, failed.message.clone())
    }

    #[test]
    fn refusals_keep_their_code_and_get_this_programs_hint() {
        // Proves the hints the coordinators no longer write are added here, by what was
        // refused, and each failure keeps its code.
        let submit = ApiRequest::SubmitJob(JobSpec::new("qs1", 0, 1, vec!["true".into()]));
        let (code, text) = text_of(
            &submit,
            ClientError::Api(ApiError::Rejected(Rejection::ShareDisabled("qs1".into()))),
        );
        assert_eq!(code, ErrorCode::FailedPrecondition);
        assert!(
            text.starts_with("share qs1 is disabled")
                && text.ends_with("`quotient share update qs1 --state enabled` enables it"),
            "{text}"
        );
        let (code, text) = text_of(
            &ApiRequest::GetShare { name: "x".into() },
            ClientError::Api(ApiError::Rejected(Rejection::UnknownShare("x".into()))),
        );
        assert_eq!(code, ErrorCode::NotFound);
        assert!(text.contains("quotient share list"), "{text}");
        let (code, text) = text_of(
            &ApiRequest::ListShares,
            ClientError::Api(ApiError::Unauthorized("user alice".into())),
        );
        assert_eq!(code, ErrorCode::Forbidden);
        assert!(text.contains("--role user"), "{text}");
        let (code, text) = text_of(
            &ApiRequest::CordonNode { node: "n".into() },
            ClientError::Api(ApiError::Unauthorized("user alice".into())),
        );
        assert_eq!(code, ErrorCode::Forbidden);
        assert!(text.contains("--role admin"), "{text}");
        let (code, text) = text_of(
            &ApiRequest::ListShares,
            ClientError::Unreachable {
                tried: "a:1: no handshake".into(),
            },
        );
        assert_eq!(code, ErrorCode::Unavailable);
        assert!(text.contains("quotient dev up"), "{text}");
    }

    #[test]
    fn a_hint_is_not_added_to_a_text_that_names_a_command_already() {
        // Proves a coordinator text that says what to do is not followed by a second hint.
        let (_, text) = text_of(
            &ApiRequest::ListShares,
            ClientError::Api(ApiError::Unavailable(
                "run `quotient cluster status`".into(),
            )),
        );
        assert_eq!(text.matches("quotient cluster status").count(), 1, "{text}");
    }

    #[test]
    fn an_unexpected_answer_is_internal_and_names_the_request() {
        // Proves the one request-naming helper names the request, and the code is Internal.
        let error = unexpected(
            &ApiRequest::GetShare { name: "x".into() },
            &ApiResponse::Done,
        );
        let failed = error
            .downcast_ref::<RequestFailed>()
            .expect("a RequestFailed");
        assert_eq!(failed.code, ErrorCode::Internal);
        assert!(
            failed.message.contains("unexpected answer to GetShare"),
            "{failed:?}"
        );
    }

    #[test]
    fn a_certificate_in_its_last_two_weeks_is_warned_of() {
        let path = std::path::Path::new("/x/alice.pem");
        let day = 86_400;
        assert_eq!(expiry_warning(path, 30 * day, 0), None);
        let soon = expiry_warning(path, 3 * day, 0).expect("a warning");
        assert!(soon.contains("in 3 days"), "{soon}");
        let gone = expiry_warning(path, 0, day).expect("a warning");
        assert!(gone.contains("expired"), "{gone}");
    }
}
