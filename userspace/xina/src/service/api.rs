//! The HTTP side of the service: requests, errors as JSON naming the field,
//! and the routes.

use std::{net::Ipv4Addr, sync::Arc};

use axum::{
    Json, Router,
    body::Bytes,
    extract::{Path, State},
    http::{HeaderMap, StatusCode, header},
    middleware,
    response::{IntoResponse, Response},
    routing::{get, post},
};
use serde::{Deserialize, Serialize};

use super::{API, Created, Leased, Leases, Renewed, Service, SwitchInfo};
use crate::config::{DTypeName, ModeName, OpName};

/// A request for a job or group (`POST /v1/jobs`).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobRequest {
    #[serde(default)]
    pub mode: ModeName,
    pub op: Option<OpName>,
    pub dtype: Option<DTypeName>,
    pub elems_per_packet: Option<u16>,
    pub bytes_per_packet: Option<u16>,
    pub slots: Option<u32>,
    pub window: Option<u32>,
    pub members: Vec<MemberRequest>,
}

/// A member of a [`JobRequest`]; its rank is its index.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemberRequest {
    pub ip: Ipv4Addr,
    pub port: u16,
    /// Looked up in the switch's neighbour table when absent.
    pub mac: Option<String>,
    /// Groups: the member may send.
    pub sender: Option<bool>,
}

impl JobRequest {
    /// Parses a request body, naming the field at fault.
    ///
    /// # Errors
    /// A 400 naming the field (`members[1].ip`).
    pub fn parse(body: &[u8]) -> Result<Self, ApiError> {
        let de = &mut serde_json::Deserializer::from_slice(body);
        serde_path_to_error::deserialize(de).map_err(|e| {
            let path = e.path().to_string();
            let message = e.inner().to_string();
            // A missing field is reported at its parent: name it.
            let missing = message
                .strip_prefix("missing field `")
                .and_then(|m| m.split('`').next());
            let field = match (path.as_str(), missing) {
                (".", Some(key)) => Some(key.to_owned()),
                (_, Some(key)) => Some(format!("{path}.{key}")),
                _ => Some(path),
            };
            ApiError::new(StatusCode::BAD_REQUEST, field, message)
        })
    }
}

/// An API error: a status, the field at fault, a message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiError {
    pub status: StatusCode,
    pub field: Option<String>,
    pub message: String,
}

impl ApiError {
    pub(super) fn new(
        status: StatusCode,
        field: Option<String>,
        message: impl Into<String>,
    ) -> Self {
        Self {
            status,
            field,
            message: message.into(),
        }
    }

    pub(super) fn field(
        status: StatusCode,
        field: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        Self::new(status, Some(field.into()), message)
    }

    pub(super) fn not_found(id: u32) -> Self {
        Self::field(
            StatusCode::NOT_FOUND,
            "id",
            format!("job {id}: no job of this tenant has that id"),
        )
    }

    pub(super) fn switch(e: &crate::dataplane::Error) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            None,
            format!("the switch: {e}"),
        )
    }
}

#[derive(Serialize)]
struct ErrorBody<'a> {
    error: ErrorDetail<'a>,
}

#[derive(Serialize)]
struct ErrorDetail<'a> {
    field: Option<&'a str>,
    message: &'a str,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = Json(ErrorBody {
            error: ErrorDetail {
                field: self.field.as_deref(),
                message: &self.message,
            },
        });
        if self.status == StatusCode::UNAUTHORIZED {
            (self.status, [(header::WWW_AUTHENTICATE, "Bearer")], body).into_response()
        } else {
            (self.status, body).into_response()
        }
    }
}

/// Serves the API on `listener` until `shutdown` completes, ending leases
/// that were not renewed every quarter second; then removes every job the
/// service leased and returns their ids.
///
/// # Errors
/// The listener fails, or the switch cannot be opened at the end.
pub async fn run(
    service: Arc<Service>,
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<Vec<u32>, RunError> {
    let ticker = Arc::clone(&service);
    let expiry = tokio::spawn(async move {
        let mut every = tokio::time::interval(std::time::Duration::from_millis(250));
        loop {
            every.tick().await;
            let s = Arc::clone(&ticker);
            match tokio::task::spawn_blocking(move || s.expire(std::time::Instant::now())).await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => log::error!("expiring leases: {e}"),
                Err(e) => log::error!("expiring leases: {e}"),
            }
        }
    });
    let served = axum::serve(listener, router(Arc::clone(&service)))
        .with_graceful_shutdown(shutdown)
        .await;
    expiry.abort();
    served.map_err(RunError::Serve)?;
    tokio::task::spawn_blocking(move || service.release_all())
        .await
        .map_err(|e| RunError::Serve(std::io::Error::other(e)))?
        .map_err(RunError::Release)
}

/// Why [`run`] failed.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("serving the API: {0}")]
    Serve(std::io::Error),
    #[error("removing the leased jobs: {0}")]
    Release(crate::dataplane::Error),
}

/// The API's routes on `service`.
pub fn router(service: Arc<Service>) -> Router {
    Router::new()
        .route("/v1/switch", get(get_switch))
        .route("/v1/jobs", get(list_jobs).post(create_job))
        .route("/v1/jobs/{id}", get(show_job).delete(delete_job))
        .route("/v1/jobs/{id}/renew", post(renew_job))
        .route("/metrics", get(get_metrics))
        .fallback(not_found)
        .layer(middleware::map_response_with_state(
            Arc::clone(&service),
            count_refusals,
        ))
        .with_state(service)
}

/// Counts every answer that refuses, whichever handler gave it.
async fn count_refusals(State(s): Shared, response: Response) -> Response {
    let status = response.status();
    if status.is_client_error() || status.is_server_error() {
        s.refused(status);
    }
    response
}

type Shared = State<Arc<Service>>;

/// Runs `f` on the blocking pool (the dataplane's maps are read with
/// system calls).
async fn blocking<T: Send + 'static>(
    service: Arc<Service>,
    f: impl FnOnce(&Service) -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(move || f(&service))
        .await
        .unwrap_or_else(|e| {
            Err(ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                None,
                format!("the request failed: {e}"),
            ))
        })
}

fn job_id(raw: &str) -> Result<u32, ApiError> {
    raw.parse().map_err(|_| {
        ApiError::field(
            StatusCode::BAD_REQUEST,
            "id",
            format!("{raw:?} is not a job id"),
        )
    })
}

async fn get_switch(State(s): Shared, headers: HeaderMap) -> Result<Json<SwitchInfo>, ApiError> {
    let tenant = s.authenticate(&headers)?;
    blocking(s, move |s| s.switch_info(tenant)).await.map(Json)
}

async fn list_jobs(State(s): Shared, headers: HeaderMap) -> Result<Json<Leases>, ApiError> {
    let tenant = s.authenticate(&headers)?;
    blocking(s, move |s| s.list(tenant)).await.map(Json)
}

async fn create_job(
    State(s): Shared,
    headers: HeaderMap,
    body: Bytes,
) -> Result<(StatusCode, Json<Created>), ApiError> {
    let tenant = s.authenticate(&headers)?;
    let req = JobRequest::parse(&body)?;
    blocking(s, move |s| s.create(tenant, &req))
        .await
        .map(|c| (StatusCode::CREATED, Json(c)))
}

async fn show_job(
    State(s): Shared,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<Leased>, ApiError> {
    let tenant = s.authenticate(&headers)?;
    let id = job_id(&id)?;
    blocking(s, move |s| s.show(tenant, id)).await.map(Json)
}

async fn renew_job(
    State(s): Shared,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<Renewed>, ApiError> {
    let tenant = s.authenticate(&headers)?;
    let id = job_id(&id)?;
    blocking(s, move |s| s.renew(tenant, id)).await.map(Json)
}

async fn delete_job(
    State(s): Shared,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    let tenant = s.authenticate(&headers)?;
    let id = job_id(&id)?;
    blocking(s, move |s| s.release(tenant, id))
        .await
        .map(|()| StatusCode::NO_CONTENT)
}

async fn get_metrics(State(s): Shared) -> Response {
    match blocking(s, Service::metrics).await {
        Ok(text) => (
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            text,
        )
            .into_response(),
        Err(e) => e.into_response(),
    }
}

async fn not_found() -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        None,
        format!("no such resource (the API is under /{API}/: switch, jobs; and /metrics)"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_request_names_the_field() {
        let field = |body: &str| {
            JobRequest::parse(body.as_bytes())
                .expect_err("accepted")
                .field
        };
        assert_eq!(
            field(r#"{"mode": "allreduce"}"#).as_deref(),
            Some("members")
        );
        assert_eq!(
            field(r#"{"members": [{"ip": "10.0.0.1", "port": 1}, {"ip": "10.0.0", "port": 1}]}"#)
                .as_deref(),
            Some("members[1].ip")
        );
        assert_eq!(
            field(r#"{"op": "product", "members": []}"#).as_deref(),
            Some("op")
        );
        assert_eq!(
            field(r#"{"members": [{"ip": "10.0.0.1", "port": 1, "colour": 2}]}"#).as_deref(),
            Some("members[0].colour")
        );
        let ok = JobRequest::parse(
            br#"{"mode": "reduce-scatter", "dtype": "i64", "members": [{"ip": "10.0.0.1", "port": 7}]}"#,
        )
        .unwrap();
        assert_eq!(ok.mode, ModeName::ReduceScatter);
        assert_eq!(ok.members[0].port, 7);
    }
}
