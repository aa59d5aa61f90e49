//! CORS: which browser origins may read the server's responses (`--cors-origins`), and the
//! answer to a preflight (`OPTIONS` on any path), as llama-server gives them.
//!
//! - `*` (the default): any origin; the request's `Origin` is echoed back with
//!   `Access-Control-Allow-Credentials: true` (a literal `*` would forbid credentials).
//! - `localhost`: only origins whose host is `localhost`, `127.0.0.1` or `[::1]` (any scheme,
//!   any port); others get no `Access-Control-Allow-Origin`, so the browser refuses them.
//! - a comma-separated list: exactly those origins.
//!
//! A preflight is answered 200 before the API key is checked (browsers send preflights
//! without credentials) and before routing, with the allowed methods and headers.

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::sync::Arc;

use super::state::AppState;

/// The methods a preflight allows.
pub const ALLOW_METHODS: &str = "GET, POST, DELETE, OPTIONS";

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CorsOrigins {
    Any,
    Localhost,
    List(Vec<String>),
}

impl CorsOrigins {
    /// `--cors-origins`: `*`, `localhost` or `origin,origin,...`; empty means no CORS headers.
    pub fn parse(s: &str) -> Result<Option<CorsOrigins>, String> {
        let s = s.trim();
        match s {
            "" => Ok(None),
            "*" => Ok(Some(CorsOrigins::Any)),
            "localhost" => Ok(Some(CorsOrigins::Localhost)),
            _ => {
                let list: Vec<String> = s.split(',').map(|o| o.trim().trim_end_matches('/').to_string()).collect();
                if let Some(bad) = list.iter().find(|o| o.is_empty() || o.chars().any(|c| c.is_whitespace() || c.is_control())) {
                    return Err(format!("'{}' is not an origin (expected *, localhost, or origins like https://example.com)", bad.escape_debug()));
                }
                Ok(Some(CorsOrigins::List(list)))
            }
        }
    }

    /// The `Access-Control-Allow-Origin` value for a request from `origin`, if it is allowed.
    pub fn allow(&self, origin: &str) -> Option<String> {
        match self {
            CorsOrigins::Any => Some(origin.to_string()),
            CorsOrigins::Localhost => is_local(origin).then(|| origin.to_string()),
            CorsOrigins::List(list) => list.iter().any(|o| o == origin.trim_end_matches('/')).then(|| origin.to_string()),
        }
    }
}

/// Whether an origin (`scheme://host[:port]`) names this machine.
fn is_local(origin: &str) -> bool {
    let Some((_, rest)) = origin.split_once("://") else { return false };
    let authority = rest.split('/').next().unwrap_or("");
    let host = if let Some(v6) = authority.strip_prefix('[') {
        v6.split(']').next().unwrap_or("")
    } else {
        authority.rsplit_once(':').map_or(authority, |(h, port)| if port.chars().all(|c| c.is_ascii_digit()) { h } else { authority })
    };
    matches!(host.to_ascii_lowercase().as_str(), "localhost" | "127.0.0.1" | "::1")
}

fn allow_origin(st: &AppState, headers: &HeaderMap) -> Option<HeaderValue> {
    let origin = headers.get(header::ORIGIN)?.to_str().ok()?;
    let allowed = st.cfg.cors.as_ref()?.allow(origin)?;
    HeaderValue::from_str(&allowed).ok()
}

/// The outermost layer: preflights answered here, every other response given the origin.
pub async fn layer(State(st): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let origin = allow_origin(&st, req.headers());
    let mut r = if req.method() == Method::OPTIONS {
        let mut r = StatusCode::OK.into_response();
        let h = r.headers_mut();
        h.insert(header::ACCESS_CONTROL_ALLOW_CREDENTIALS, HeaderValue::from_static("true"));
        h.insert(header::ACCESS_CONTROL_ALLOW_METHODS, HeaderValue::from_static(ALLOW_METHODS));
        h.insert(header::ACCESS_CONTROL_ALLOW_HEADERS, HeaderValue::from_static("*"));
        r
    } else {
        next.run(req).await
    };
    if let Some(o) = origin {
        r.headers_mut().insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, o);
        r.headers_mut().insert(header::ACCESS_CONTROL_ALLOW_CREDENTIALS, HeaderValue::from_static("true"));
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins_are_matched_as_llama_server_matches_them() {
        let any = CorsOrigins::parse("*").unwrap().unwrap();
        assert_eq!(any.allow("web.mydomain.fr").as_deref(), Some("web.mydomain.fr"));
        let local = CorsOrigins::parse("localhost").unwrap().unwrap();
        for ok in ["http://localhost", "http://localhost:8080", "http://127.0.0.1", "https://127.0.0.1:3000", "http://[::1]", "http://[::1]:3000"] {
            assert_eq!(local.allow(ok).as_deref(), Some(ok), "{ok}");
        }
        for bad in ["http://web.mydomain.fr", "http://evil.com", "http://notlocalhost", "http://localhost.evil.com", "localhost", "http://[::2]"] {
            assert_eq!(local.allow(bad), None, "{bad}");
        }
        let list = CorsOrigins::parse("https://a.example, https://b.example/").unwrap().unwrap();
        assert!(list.allow("https://b.example").is_some());
        assert!(list.allow("https://c.example").is_none());
        assert_eq!(CorsOrigins::parse(" ").unwrap(), None);
        assert!(CorsOrigins::parse("a,,b").is_err());
    }
}
