//! The AWS endpoint's errors, as AWS clients read them: an HTTP status, the error's type in
//! the `x-amzn-ErrorType` header and in the body's `__type`, and a `message`.

use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use quotient_common::api::ApiError;
use quotient_common::error_code::ErrorCode;

/// One refusal or failure of the endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AwsError {
    pub status: u16,
    /// The AWS error type (`ClientException`, `InvalidSignatureException`...).
    pub code: &'static str,
    pub message: String,
}

impl AwsError {
    /// The request is wrong (the service model's `ClientException`, 400).
    pub fn client(message: impl Into<String>) -> AwsError {
        AwsError {
            status: 400,
            code: "ClientException",
            message: message.into(),
        }
    }

    /// The service failed (`ServerException`, 500).
    pub fn server(message: impl Into<String>) -> AwsError {
        AwsError {
            status: 500,
            code: "ServerException",
            message: message.into(),
        }
    }

    pub fn access_denied(message: impl Into<String>) -> AwsError {
        AwsError {
            status: 403,
            code: "AccessDeniedException",
            message: message.into(),
        }
    }

    pub fn unknown_operation(method: &str, path: &str) -> AwsError {
        AwsError {
            status: 404,
            code: "UnknownOperationException",
            message: format!(
                "{method} {path} is not an operation this endpoint serves: it serves the quota \
                 share and service job operations of AWS Batch, and enough of job queues, \
                 service environments and scheduling policies to set them up (docs/aws-batch.md)"
            ),
        }
    }

    /// What the QUIC API's error becomes: the caller's mistakes are `ClientException`s, a
    /// refusal for lack of rights `AccessDeniedException`, the cluster's trouble
    /// `ServerException` (botocore retries those).
    pub fn from_api(error: ApiError) -> AwsError {
        let message = error.to_string();
        match error.code() {
            ErrorCode::Forbidden => AwsError::access_denied(message),
            ErrorCode::NotLeader
            | ErrorCode::Unavailable
            | ErrorCode::Uncertain
            | ErrorCode::Internal
            | ErrorCode::Local => AwsError::server(message),
            ErrorCode::InvalidArgument
            | ErrorCode::NotFound
            | ErrorCode::Conflict
            | ErrorCode::FailedPrecondition
            | ErrorCode::LimitExceeded => AwsError::client(message),
        }
    }
}

impl IntoResponse for AwsError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::BAD_REQUEST);
        let body = serde_json::json!({ "__type": self.code, "message": self.message });
        let mut response = super::json_response(status, &body);
        response
            .headers_mut()
            .insert("x-amzn-ErrorType", HeaderValue::from_static(self.code));
        response
    }
}
