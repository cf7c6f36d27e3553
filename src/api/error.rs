//! Errors in OpenAI's JSON shape: `{"error": {"message", "type", "param", "code"}}`.
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub kind: &'static str,
    pub param: Option<&'static str>,
    pub code: Option<&'static str>,
    pub retry_after_secs: Option<u64>,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        ApiError { status, message: message.into(), kind, param: None, code: None, retry_after_secs: None }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "invalid_request_error", message)
    }

    pub fn model_not_found(model: &str) -> Self {
        Self::not_found(format!("The model '{model}' does not exist; GET /v1/models lists the models this server has"))
            .param("model")
            .code("model_not_found")
    }

    pub fn payload_too_large(limit: usize) -> Self {
        Self::new(StatusCode::PAYLOAD_TOO_LARGE, "invalid_request_error", format!("The request body exceeds the limit of {limit} bytes"))
            .code("payload_too_large")
    }

    pub fn queue_full(waiting: usize, retry_after_secs: u64) -> Self {
        let mut e = Self::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limit_error",
            format!("The server is busy: {waiting} requests are already waiting (queue_capacity). Retry in about {retry_after_secs} s."),
        )
        .code("queue_full");
        e.retry_after_secs = Some(retry_after_secs);
        e
    }

    /// 507: memory for a request, or disk for a bench run's results, is lacking.
    pub fn insufficient_storage(message: impl Into<String>, code: &'static str) -> Self {
        Self::new(StatusCode::INSUFFICIENT_STORAGE, "server_error", message).code(code)
    }

    pub fn insufficient_memory(message: impl Into<String>) -> Self {
        Self::insufficient_storage(message, "insufficient_memory")
    }

    pub fn shutting_down() -> Self {
        let mut e = Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            "The server is shutting down; in-flight requests finish, new ones are refused.",
        )
        .code("shutting_down");
        e.retry_after_secs = Some(10);
        e
    }

    pub fn unsupported_media_type(got: Option<&str>) -> Self {
        let got = got.map_or("none".to_string(), |g| format!("'{g}'"));
        Self::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "invalid_request_error",
            format!("This route takes a JSON body: send 'Content-Type: application/json' (got {got})"),
        )
        .code("unsupported_media_type")
    }

    pub fn forbidden_origin(why: String) -> Self {
        Self::new(StatusCode::FORBIDDEN, "invalid_request_error", why).code("origin_not_allowed")
    }

    pub fn unavailable(message: impl Into<String>) -> Self {
        let mut e = Self::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", message).code("model_not_ready");
        e.retry_after_secs = Some(2);
        e
    }

    pub fn paused() -> Self {
        let mut e =
            Self::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", "Serving is paused (menu bar: Resume serving). Retry later.")
                .code("serving_paused");
        e.retry_after_secs = Some(30);
        e
    }

    pub fn memory_pressure() -> Self {
        let mut e = Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            "Memory pressure is critical: new requests are refused so the machine does not swap. Retry later.",
        )
        .code("memory_pressure");
        e.retry_after_secs = Some(10);
        e
    }

    pub fn conflict(message: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, "invalid_request_error", message)
    }

    pub fn bench_running(retry_after_secs: u64) -> Self {
        let mut e = Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            format!("A benchmark run is using the engine; retry in about {retry_after_secs} s (or cancel it: DELETE /api/bench/<id>)."),
        )
        .code("bench_running");
        e.retry_after_secs = Some(retry_after_secs);
        e
    }

    /// Every connection slot is busy with work (`max_connections`).
    pub fn too_many_connections() -> Self {
        let mut e = Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            "The server is serving as many connections as it allows (max_connections); retry shortly.",
        )
        .code("too_many_connections");
        e.retry_after_secs = Some(1);
        e
    }

    /// As many live streams as `max_stream_subscribers` are open.
    pub fn too_many_streams(max: usize) -> Self {
        let mut e = Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            format!("{max} live streams are open already (max_stream_subscribers); close one or poll /api/metrics/snapshot"),
        )
        .code("too_many_streams");
        e.retry_after_secs = Some(5);
        e
    }

    /// The request body did not arrive in time (`body_read_timeout_seconds`).
    pub fn request_timeout(secs: f64) -> Self {
        Self::new(StatusCode::REQUEST_TIMEOUT, "invalid_request_error", format!("The request body did not arrive within {secs} s"))
            .code("request_timeout")
    }

    /// Preparing requests (templates, tokenizing, grammars) is backed up past its deadline.
    pub fn preparation_busy(retry_after_secs: u64) -> Self {
        let mut e = Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            format!("The server is busy preparing other requests (prepare_threads); retry in about {retry_after_secs} s."),
        )
        .code("server_busy");
        e.retry_after_secs = Some(retry_after_secs);
        e
    }

    pub fn unauthorized() -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "invalid_request_error", "Missing or incorrect API key: send 'Authorization: Bearer <key>'")
            .code("invalid_api_key")
    }

    pub fn forbidden_host(host: &str) -> Self {
        Self::new(
            StatusCode::FORBIDDEN,
            "invalid_request_error",
            format!("Host '{host}' is not allowed (DNS rebinding protection); add it with --allowed-host"),
        )
        .code("host_not_allowed")
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message).code("engine_error")
    }

    pub fn param(mut self, param: &'static str) -> Self {
        self.param = Some(param);
        self
    }

    pub fn code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }

    pub fn body(&self) -> serde_json::Value {
        json!({"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut resp = (self.status, axum::Json(self.body())).into_response();
        if let Some(secs) = self.retry_after_secs {
            resp.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        resp
    }
}

impl From<crate::engine::SubmitError> for ApiError {
    fn from(e: crate::engine::SubmitError) -> Self {
        use crate::engine::SubmitError::*;
        match e {
            QueueFull { waiting, retry_after_secs } => ApiError::queue_full(waiting, retry_after_secs),
            Loading => ApiError::unavailable("The model is still loading; retry shortly"),
            Unavailable(why) => ApiError::unavailable(format!("The engine is not available: {why}")),
        }
    }
}

impl From<crate::engine::EngineError> for ApiError {
    fn from(e: crate::engine::EngineError) -> Self {
        use crate::engine::ErrorKind::*;
        match e.kind {
            Internal => ApiError::internal(format!("The engine failed on this request: {}", e.message)),
            OutOfMemory => ApiError::insufficient_memory(format!("Not enough memory for this request: {}", e.message)),
            ShuttingDown => ApiError::shutting_down(),
            Stuck => ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", format!("The engine stopped answering: {}", e.message))
                .code("engine_stuck"),
            Grammar => ApiError::bad_request(format!(
                "The output grammar reached the grammar engine's limits while generating ({}); a schema with fewer optional properties side by side (or required ones) stays within them",
                e.message.trim_start_matches(crate::engine::constraint::RUNTIME_ERROR).trim()
            ))
            .code("unsupported_schema"),
        }
    }
}

impl From<crate::registry::ModelError> for ApiError {
    fn from(e: crate::registry::ModelError) -> Self {
        use crate::registry::budget::Refusal;
        use crate::registry::ModelError::*;
        match e {
            NotFound(model) => ApiError::model_not_found(&model),
            NotRunnable { .. } => ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_request_error", e.to_string())
                .param("model")
                .code("model_not_runnable"),
            Refused { refusal: Refusal::Memory { .. }, message } => ApiError::insufficient_memory(message),
            Refused { refusal: Refusal::Pressure, .. } => ApiError::memory_pressure(),
            Refused { refusal: Refusal::Busy { .. }, message } => {
                let mut e = ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", message).code("models_busy");
                e.retry_after_secs = Some(5);
                e
            }
            Failed { reason, .. } => ApiError::unavailable(format!("The engine is not available: {reason}")),
            Loading(model) => ApiError::unavailable(format!("{model} is still loading; retry shortly")),
            NotLoaded(_) => ApiError::conflict(e.to_string()).code("model_not_loaded"),
            QueueFull { waiting } => ApiError::queue_full(waiting, 5),
            Stopped => ApiError::shutting_down(),
            Busy(message) => ApiError::conflict(message).code("models_busy"),
        }
    }
}
