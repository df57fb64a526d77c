//! The few pieces of `wasi:http` the function needs: a parsed request in,
//! a JSON reply out.

use wasip2::http::types::{
    Fields, IncomingRequest, Method, OutgoingBody, OutgoingResponse, ResponseOutparam,
};

/// Request bodies larger than this are refused with 413.
const MAX_BODY_BYTES: usize = 16 * 1024;

/// A request reduced to what the routes look at.
pub struct Request {
    /// The method, upper case (`GET`, `POST`, ...).
    pub method: String,
    /// The path's segments, without empty ones: `/items/a/` is `["items", "a"]`.
    pub segments: Vec<String>,
    /// The query's `name=value` pairs, percent-decoded.
    pub query: Vec<(String, String)>,
    /// The `x-user-id` header, when present and UTF-8.
    pub user: Option<String>,
    /// The `idempotency-key` header, when present and UTF-8.
    pub idempotency_key: Option<String>,
    /// The body's bytes.
    pub body: Vec<u8>,
}

impl Request {
    /// Read `incoming` whole. A body over the limit is a 413 reply.
    pub fn read(incoming: &IncomingRequest) -> Result<Request, Reply> {
        let method = match incoming.method() {
            Method::Get => "GET".to_string(),
            Method::Post => "POST".to_string(),
            Method::Put => "PUT".to_string(),
            Method::Delete => "DELETE".to_string(),
            Method::Head => "HEAD".to_string(),
            Method::Patch => "PATCH".to_string(),
            Method::Options => "OPTIONS".to_string(),
            Method::Connect => "CONNECT".to_string(),
            Method::Trace => "TRACE".to_string(),
            Method::Other(other) => other,
        };
        let target = incoming.path_with_query().unwrap_or_default();
        let (path, query) = target.split_once('?').unwrap_or((&target, ""));
        let segments = path
            .split('/')
            .filter(|s| !s.is_empty())
            .map(percent_decode)
            .collect();
        let query = query
            .split('&')
            .filter(|pair| !pair.is_empty())
            .map(|pair| {
                let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
                (percent_decode(name), percent_decode(value))
            })
            .collect();
        let header = |name: &str| {
            incoming
                .headers()
                .get(name)
                .into_iter()
                .next()
                .and_then(|value| String::from_utf8(value).ok())
        };
        let user = header("x-user-id");
        let idempotency_key = header("idempotency-key");
        let body = read_body(incoming)?;
        Ok(Request {
            method,
            segments,
            query,
            user,
            idempotency_key,
            body,
        })
    }

    /// The query parameter `name`, if given.
    pub fn param(&self, name: &str) -> Option<&str> {
        self.query
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

fn read_body(incoming: &IncomingRequest) -> Result<Vec<u8>, Reply> {
    use std::io::Read;
    let unreadable = |what: &str| Reply::error(400, "body", what);
    let body = incoming
        .consume()
        .map_err(|()| unreadable("the body was already taken"))?;
    let mut bytes = Vec::new();
    {
        let stream = body
            .stream()
            .map_err(|()| unreadable("the body stream was already taken"))?;
        // One byte past the limit tells "too large" from "exactly the limit".
        let limit = u64::try_from(MAX_BODY_BYTES + 1).unwrap_or(u64::MAX);
        stream
            .take(limit)
            .read_to_end(&mut bytes)
            .map_err(|e| unreadable(&format!("reading it failed: {e}")))?;
    }
    if bytes.len() > MAX_BODY_BYTES {
        return Err(Reply::error(
            413,
            "body",
            &format!("larger than {MAX_BODY_BYTES} bytes"),
        ));
    }
    Ok(bytes)
}

/// Decode `%XX` escapes and `+` (as a space); an invalid escape stays as written.
fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("");
                match u8::from_str_radix(hex, 16) {
                    Ok(byte) => {
                        out.push(byte);
                        i += 3;
                    }
                    Err(_) => {
                        out.push(b'%');
                        i += 1;
                    }
                }
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            byte => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A response: status, extra headers and a JSON body.
pub struct Reply {
    /// The HTTP status code.
    pub status: u16,
    /// Headers besides `content-type`.
    pub headers: Vec<(String, String)>,
    /// The JSON body.
    pub body: serde_json::Value,
}

impl Reply {
    /// 200 with `body`.
    pub fn ok(body: serde_json::Value) -> Reply {
        Reply::with_status(200, body)
    }

    /// `status` with `body`.
    pub fn with_status(status: u16, body: serde_json::Value) -> Reply {
        Reply {
            status,
            headers: Vec::new(),
            body,
        }
    }

    /// An error reply that names the field at fault.
    pub fn error(status: u16, field: &str, reason: &str) -> Reply {
        Reply::with_status(
            status,
            serde_json::json!({ "error": reason, "field": field }),
        )
    }

    /// Add a header.
    pub fn header(mut self, name: &str, value: String) -> Reply {
        self.headers.push((name.to_string(), value));
        self
    }

    /// Send the reply through `out`. Failures here can only be reported to
    /// the host's log, so they end the request without a body.
    pub fn send(self, out: ResponseOutparam) {
        use std::io::Write;
        let mut text = self.body.to_string().into_bytes();
        text.push(b'\n');
        // A known length lets the host skip chunked encoding.
        let mut fields = vec![
            ("content-type".to_string(), b"application/json".to_vec()),
            (
                "content-length".to_string(),
                text.len().to_string().into_bytes(),
            ),
        ];
        fields.extend(
            self.headers
                .into_iter()
                .map(|(name, value)| (name, value.into_bytes())),
        );
        let Ok(headers) = Fields::from_list(&fields) else {
            let fallback = OutgoingResponse::new(Fields::new());
            let _ = fallback.set_status_code(500);
            ResponseOutparam::set(out, Ok(fallback));
            return;
        };
        let response = OutgoingResponse::new(headers);
        let _ = response.set_status_code(self.status);
        let Ok(body) = response.body() else {
            ResponseOutparam::set(out, Ok(response));
            return;
        };
        ResponseOutparam::set(out, Ok(response));
        if let Ok(mut stream) = body.write() {
            let _ = stream
                .write_all(&text)
                .and_then(|()| Write::flush(&mut stream));
        }
        let _ = OutgoingBody::finish(body, None);
    }
}

#[cfg(test)]
mod tests {
    use super::percent_decode;

    #[test]
    fn percent_decoding_handles_escapes_plus_and_bad_escapes() {
        assert_eq!(percent_decode("a%20b+c"), "a b c");
        assert_eq!(percent_decode("item%3A1"), "item:1");
        assert_eq!(percent_decode("100%"), "100%");
        assert_eq!(percent_decode("%zz"), "%zz");
        assert_eq!(percent_decode("%4"), "%4");
    }
}
