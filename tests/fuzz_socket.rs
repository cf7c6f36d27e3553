//! A bounded live-socket fuzzer: for about 20 s, raw TCP requests with random and mutated
//! methods, paths, headers and bodies against the real server. Every answer must be a
//! well-formed HTTP/1.x response (status line, headers, a body framed by Content-Length or
//! chunked encoding); a 4xx/5xx with a body must carry a JSON `error.message`. A closed
//! connection without an answer is accepted only when the request's framing was broken on
//! purpose. At the end the server is healthy and still answers a normal chat request.
//!
//! Seeded (fixed by default, so CI repeats itself): the seed is printed; `MLXBAR_FUZZ_SEED=<n>` replays a run, `=random` explores, and
//! `MLXBAR_FUZZ_SECONDS` changes the budget. Generation requests ask for at most 4 tokens
//! so the engine is exercised but not flooded.
mod common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Value};

/// Bodies past this may be cut off by a server that answers early and closes (TCP then
/// resets, which can drop the answer on our side).
/// (Seen with a 41 KB body on a route that reads none.)
const EARLY_CLOSE_BODY: usize = 8 * 1024;
/// A generation of at most 4 tokens answers in well under a second; this is a hang.
const READ_TIMEOUT: Duration = Duration::from_secs(20);

/// One generated request.
struct Fuzzed {
    bytes: Vec<u8>,
    /// HTTP framing intact: an answer is required.
    framed: bool,
    head: bool,
    /// The stream holds exactly this request (no extra bytes), so a second request may follow.
    clean: bool,
    body_len: usize,
    what: String,
}

#[derive(Debug)]
struct Response {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Response {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
}

#[test]
fn random_requests_get_well_formed_answers_and_the_server_survives() {
    // A fixed seed by default, so CI is repeatable; MLXBAR_FUZZ_SEED=random explores.
    let seed = match std::env::var("MLXBAR_FUZZ_SEED").ok().as_deref() {
        Some("random") => std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64,
        Some(s) => s.parse().expect("MLXBAR_FUZZ_SEED: a number or 'random'"),
        None => 20261201,
    };
    let budget = Duration::from_secs_f64(std::env::var("MLXBAR_FUZZ_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(20.0));
    eprintln!("fuzz_socket: seed {seed} (MLXBAR_FUZZ_SEED={seed} replays it), budget {budget:?}");
    let base = common::server();
    let addr = base.strip_prefix("http://").unwrap().to_string();
    let port: u16 = addr.rsplit(':').next().unwrap().parse().unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);

    let started = Instant::now();
    let mut statuses: BTreeMap<String, usize> = BTreeMap::new();
    // Distinct violations (by their first line), each with the first request that showed it:
    // the run goes on, so one report lists everything the budget found.
    let mut violations: BTreeMap<String, String> = BTreeMap::new();
    let mut n = 0usize;
    while started.elapsed() < budget {
        let req = fuzz_request(&mut rng, port);
        let follow_up = rng.random_bool(0.15);
        match exchange(&addr, &req, follow_up) {
            Ok(outcome) => *statuses.entry(outcome).or_default() += 1,
            Err(e) if e.starts_with("the server is gone") => panic!("seed {seed}, request #{n} ({}): {e}", req.what),
            Err(e) => {
                let first_line = e.lines().next().unwrap_or_default().to_string();
                violations.entry(first_line).or_insert_with(|| {
                    format!(
                        "request #{n} ({}): {e}\nrequest (first 600 bytes): {:?}",
                        req.what,
                        String::from_utf8_lossy(&req.bytes[..req.bytes.len().min(600)])
                    )
                });
                *statuses.entry("VIOLATION".into()).or_default() += 1;
            }
        }
        n += 1;
    }
    eprintln!("fuzz_socket: {n} requests in {:.1}s; outcomes {statuses:?}", started.elapsed().as_secs_f64());
    assert!(
        violations.is_empty(),
        "seed {seed}: {} kinds of bad answers:\n\n{}",
        violations.len(),
        violations.into_values().collect::<Vec<_>>().join("\n\n")
    );
    assert!(n > 50, "only {n} requests in the budget");

    // Still alive and still serving.
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let client = reqwest::Client::builder().timeout(Duration::from_secs(60)).build().unwrap();
        let health = client.get(format!("{base}/health")).send().await.unwrap();
        assert_eq!(health.status(), 200);
        let chat = client
            .post(format!("{base}/v1/chat/completions"))
            .json(&json!({"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4, "temperature": 0}))
            .send()
            .await
            .unwrap();
        assert_eq!(chat.status(), 200);
        let body: Value = chat.json().await.unwrap();
        assert!(body["choices"][0]["message"]["content"].as_str().is_some_and(|c| !c.is_empty()), "{body}");
        assert!(body["usage"]["completion_tokens"].as_u64().is_some_and(|t| (1..=4).contains(&t)), "{body}");
    });
}

/// Sends one request and checks the answer; returns a short outcome for the summary.
fn exchange(addr: &str, req: &Fuzzed, follow_up: bool) -> Result<String, String> {
    let sock = TcpStream::connect(addr).map_err(|e| format!("the server is gone: {e}"))?;
    sock.set_read_timeout(Some(READ_TIMEOUT)).unwrap();
    sock.set_write_timeout(Some(READ_TIMEOUT)).unwrap();
    sock.set_nodelay(true).unwrap();
    let big = req.body_len > EARLY_CLOSE_BODY || req.bytes.len() > EARLY_CLOSE_BODY;
    let mut reader = BufReader::new(sock);
    if let Err(e) = reader.get_mut().write_all(&req.bytes) {
        // The server may answer and close before a large or broken request is all sent.
        if req.framed && !big {
            return Err(format!("writing the request: {e}"));
        }
    }
    if !req.framed {
        // Broken framing may leave the server waiting for more; end our side.
        let _ = reader.get_mut().shutdown(std::net::Shutdown::Write);
    }
    let resp = match read_response(&mut reader, req.head) {
        Ok(Some(r)) => r,
        Ok(None) if !req.framed => return Ok("closed (broken framing)".into()),
        Ok(None) => return Err("the connection closed without an answer".into()),
        Err(e) if is_reset(&e) && (!req.framed || big) => return Ok("reset (early close)".into()),
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
            return Err(format!("no answer within {READ_TIMEOUT:?}"))
        }
        Err(e) => return Err(e.to_string()),
    };
    check(&resp).map_err(|e| {
        // The body's start on the first line tells apart kinds of the same violation.
        let body = String::from_utf8_lossy(&resp.body[..resp.body.len().min(400)]).into_owned();
        let kind: String = body.chars().take(24).collect();
        format!("{e}: {kind:?}\nresponse: {} {:?} {body:?}", resp.status, resp.headers)
    })?;

    let closes = resp.header("connection").is_some_and(|c| c.eq_ignore_ascii_case("close"));
    if follow_up && req.framed && req.clean && !closes {
        // The same connection must still parse a next request (or be closed cleanly).
        let sent = reader.get_mut().write_all(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n");
        if sent.is_ok() {
            match read_response(&mut reader, false) {
                Ok(Some(r)) if r.status == 200 => {}
                Ok(Some(r)) => return Err(format!("a follow-up GET /health got {} {:?}", r.status, String::from_utf8_lossy(&r.body))),
                Ok(None) => {}
                Err(e) if is_reset(&e) => {}
                Err(e) => return Err(format!("the follow-up GET /health: {e}")),
            }
        }
    }
    Ok(resp.status.to_string())
}

fn is_reset(e: &std::io::Error) -> bool {
    matches!(e.kind(), ErrorKind::ConnectionReset | ErrorKind::ConnectionAborted | ErrorKind::BrokenPipe)
}

/// What every answer must satisfy.
fn check(resp: &Response) -> Result<(), String> {
    if !(100..=599).contains(&resp.status) {
        return Err(format!("status {} out of range", resp.status));
    }
    if resp.status >= 400 && !resp.body.is_empty() {
        let v: Value = serde_json::from_slice(&resp.body).map_err(|e| format!("a {} error body is not JSON ({e})", resp.status))?;
        if v["error"]["message"].as_str().is_none_or(|m| m.is_empty()) {
            return Err(format!("a {} error body has no error.message: {v}", resp.status));
        }
    }
    Ok(())
}

// ------------------------------------------------------------------ HTTP response reader

fn bad(msg: impl Into<String>) -> std::io::Error {
    std::io::Error::new(ErrorKind::InvalidData, msg.into())
}

/// Reads one response (skipping 1xx interim ones). `Ok(None)`: the peer closed before
/// sending a byte. A response cut short is an error.
fn read_response(r: &mut BufReader<TcpStream>, head_request: bool) -> std::io::Result<Option<Response>> {
    loop {
        let mut head = Vec::new();
        while !head.ends_with(b"\r\n\r\n") {
            let mut line = Vec::new();
            let n = r.read_until(b'\n', &mut line)?;
            if n == 0 {
                return if head.is_empty() {
                    Ok(None)
                } else {
                    Err(bad(format!("the answer stops inside its head: {:?}", String::from_utf8_lossy(&head))))
                };
            }
            head.extend(line);
            if head.len() > 1 << 20 {
                return Err(bad("a response head over 1 MB"));
            }
        }
        let mut headers = [httparse::EMPTY_HEADER; 128];
        let mut parsed = httparse::Response::new(&mut headers);
        match parsed.parse(&head) {
            Ok(httparse::Status::Complete(_)) => {}
            other => return Err(bad(format!("not an HTTP response head ({other:?}): {:?}", String::from_utf8_lossy(&head)))),
        }
        let status = parsed.code.unwrap();
        if parsed.version != Some(1) && parsed.version != Some(0) {
            return Err(bad(format!("HTTP version 1.{:?}", parsed.version)));
        }
        let headers: Vec<(String, String)> = parsed
            .headers
            .iter()
            .map(|h| {
                String::from_utf8(h.value.to_vec())
                    .map(|v| (h.name.to_string(), v))
                    .map_err(|_| bad(format!("header {} is not UTF-8", h.name)))
            })
            .collect::<Result<_, _>>()?;
        if (100..200).contains(&status) {
            continue;
        }
        let get = |name: &str| headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.clone());
        let body = if head_request || status == 204 || status == 304 {
            vec![]
        } else if get("transfer-encoding").is_some_and(|t| t.eq_ignore_ascii_case("chunked")) {
            if get("content-length").is_some() {
                return Err(bad("both Content-Length and chunked"));
            }
            read_chunked(r)?
        } else if let Some(len) = get("content-length") {
            let len: usize = len.trim().parse().map_err(|_| bad(format!("Content-Length {len:?}")))?;
            let mut body = vec![0; len];
            r.read_exact(&mut body).map_err(|e| {
                if e.kind() == ErrorKind::UnexpectedEof {
                    bad(format!("the body stops before its {len} bytes"))
                } else {
                    e
                }
            })?;
            body
        } else {
            // Close-delimited: legal, but then the server must close.
            let mut body = Vec::new();
            r.read_to_end(&mut body)?;
            body
        };
        return Ok(Some(Response { status, headers, body }));
    }
}

fn read_chunked(r: &mut BufReader<TcpStream>) -> std::io::Result<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let mut line = String::new();
        if r.read_line(&mut line)? == 0 {
            return Err(bad("a chunked body stops before its last chunk"));
        }
        let size = line.trim_end().split(';').next().unwrap_or("");
        let size = usize::from_str_radix(size.trim(), 16).map_err(|_| bad(format!("chunk size line {line:?}")))?;
        if size == 0 {
            // Trailers until the empty line.
            loop {
                let mut t = String::new();
                if r.read_line(&mut t)? == 0 || t == "\r\n" {
                    return Ok(body);
                }
            }
        }
        let start = body.len();
        body.resize(start + size, 0);
        r.read_exact(&mut body[start..])?;
        let mut crlf = [0u8; 2];
        r.read_exact(&mut crlf)?;
        if &crlf != b"\r\n" {
            return Err(bad("a chunk not followed by CRLF"));
        }
    }
}

// ------------------------------------------------------------------- request generation

const PATHS: &[&str] = &[
    "/",
    "/health",
    "/metrics",
    "/v1/models",
    "/v1/chat/completions",
    "/v1/completions",
    "/api/metrics/snapshot",
    "/api/alerts",
    "/api/alerts/queue_backlog/snooze",
    "/api/alerts/nope/snooze",
    "/api/bench/profiles",
    "/api/bench",
    "/api/bench/does-not-exist",
    "/api/bench/x/report",
    "/api/history",
    "/api/history/abc",
    "/ui/app.js",
    "/ui/../../etc/passwd",
    "/ui/%2e%2e/%2e%2e/Cargo.toml",
    "/ui/vendor/uPlot.min.css",
    "/v1",
    "/v2/chat/completions",
];

fn fuzz_request(rng: &mut ChaCha8Rng, port: u16) -> Fuzzed {
    let mut framed = true;
    let mut clean = true;
    let mut what = vec![];

    // Method.
    let method: String = match rng.random_range(0..100) {
        0..30 => "GET".into(),
        30..72 => "POST".into(),
        72..90 => ["PUT", "DELETE", "HEAD", "OPTIONS", "PATCH", "TRACE", "post", "FOO"].choose(rng).unwrap().to_string(),
        90..95 => {
            framed = false;
            ["G ET", "", "CONNECT", "\0POST", "GET\t"].choose(rng).unwrap().to_string()
        }
        _ => {
            framed = false;
            random_bytes(rng, 1..12).into_iter().map(char::from).collect()
        }
    };

    // Path.
    let mut path: String = PATHS.choose(rng).unwrap().to_string();
    match rng.random_range(0..100) {
        0..45 => {}
        45..55 => path
            .push_str(&format!("?{}", ["a=b", "a=%zz&&b", "=", "x=%00", "stream=true", "limit=-1&limit=9999999999"].choose(rng).unwrap())),
        55..63 => path = percent_encode_some(rng, &path),
        63..70 => {
            let bad = ["%", "%G1", "%ff", "%c3%28", "%00", "/%2e%2e/", "/../", "/./", "//", ";x", "#frag"].choose(rng).unwrap();
            let at = rng.random_range(0..=path.len());
            path.insert_str(at, bad);
        }
        70..75 => {
            let unit = ["a/", "%41", "../", "x"].choose(rng).unwrap();
            let n = rng.random_range(1_000..20_000);
            path = format!("/{}", unit.repeat(n));
            what.push(format!("huge path {}", path.len()));
            // URIs past 64 KB are refused by the http crate: an answer or a close.
            if path.len() > 60_000 {
                framed = false;
            }
        }
        75..82 => path = (0..rng.random_range(1..40)).map(|_| char::from(rng.random_range(0x21u8..0x7f))).collect(),
        82..86 => path = ["*", "http://localhost/health", "http://evil.example/v1/models", "localhost:80"].choose(rng).unwrap().to_string(),
        _ => {
            framed = false;
            path = String::from_utf8_lossy(&random_bytes(rng, 1..30)).into_owned();
        }
    }
    if !path.starts_with('/') && !path.starts_with("http") && path != "*" {
        // Origin-form needs a leading slash; without one hyper may refuse the line.
        framed = false;
    }
    // Never start a bench run: it would hold the engine for the rest of the budget.
    let method = if method.eq_ignore_ascii_case("POST") && path.contains("bench") { "GET".to_string() } else { method };
    let head = method == "HEAD";

    // Body.
    let body = fuzz_body(rng, &path, &mut what);

    // Version.
    let version = match rng.random_range(0..100) {
        0..95 => "HTTP/1.1",
        95..98 => "HTTP/1.0",
        _ => {
            framed = false;
            ["HTTP/2.0", "HTTP/1.2", "HTTX/1.1", "", "HTTP/1.1 extra"].choose(rng).unwrap()
        }
    };

    let mut headers: Vec<(String, Vec<u8>)> = vec![];
    let mut h = |name: &str, value: &[u8]| headers.push((name.to_string(), value.to_vec()));
    match rng.random_range(0..100) {
        0..70 => h("Host", format!("{}:{port}", ["localhost", "127.0.0.1"].choose(rng).unwrap()).as_bytes()),
        70..78 => {}
        78..88 => h(
            "Host",
            ["evil.example", "localhost.evil:80", "127.0.0.1.evil", "[::1]x", "user@localhost", ""].choose(rng).unwrap().as_bytes(),
        ),
        88..94 => {
            h("Host", b"localhost");
            h("Host", b"evil.example");
        }
        _ => {
            h("Host", &random_bytes(rng, 1..20));
            framed = false;
        }
    }
    let content_type = [
        "application/json",
        "application/json; charset=utf-8",
        "APPLICATION/JSON",
        "text/plain",
        "multipart/form-data; boundary=x",
        "application/x-www-form-urlencoded",
        "application/jsonx",
        "application/json\t",
        "",
    ];
    match rng.random_range(0..100) {
        0..65 => h("Content-Type", b"application/json"),
        65..90 => h("Content-Type", content_type.choose(rng).unwrap().as_bytes()),
        _ => {}
    }
    match rng.random_range(0..100) {
        0..60 => h("Connection", b"close"),
        60..80 => h("Connection", b"keep-alive"),
        80..85 => h("Connection", b"upgrade, close"),
        _ => {}
    }
    if rng.random_bool(0.1) {
        h("Origin", ["http://evil.example", "null", "http://localhost", "http://127.0.0.1:1"].choose(rng).unwrap().as_bytes());
    }
    if rng.random_bool(0.05) {
        h("Expect", b"100-continue");
    }
    if rng.random_bool(0.05) {
        h("Accept", b"text/event-stream");
    }
    if rng.random_bool(0.05) {
        h("Authorization", b"Bearer nothing-configured");
    }
    if rng.random_bool(0.04) {
        let n = rng.random_range(8_000..120_000);
        h("X-Huge", "v".repeat(n).as_bytes());
        what.push(format!("huge header {n}"));
    }
    if rng.random_bool(0.03) {
        let n = rng.random_range(20..150);
        for i in 0..n {
            h(&format!("X-Many-{i}"), b"1");
        }
        what.push(format!("{n} extra headers"));
        // hyper takes 100 headers; past that it refuses (an answer or a close).
        if n > 80 {
            framed = false;
        }
    }
    match rng.random_range(0..100) {
        0..3 => {
            h("X Bad Name", b"1");
            framed = false;
        }
        3..5 => {
            h("X-Ctl", b"a\x01b");
            framed = false;
        }
        _ => {}
    }

    // Framing of the body.
    let mut body_bytes = body;
    let mut tail: Vec<u8> = vec![];
    match rng.random_range(0..100) {
        0..80 => h("Content-Length", body_bytes.len().to_string().as_bytes()),
        80..85 => {
            // No length: the body becomes the start of a next request.
            clean = body_bytes.is_empty();
        }
        85..88 if !body_bytes.is_empty() => {
            let short = rng.random_range(0..body_bytes.len());
            h("Content-Length", short.to_string().as_bytes());
            clean = false;
        }
        88..91 => {
            // Declares more than is sent.
            h("Content-Length", (body_bytes.len() + rng.random_range(1..5_000_000)).to_string().as_bytes());
            framed = false;
        }
        91..94 => {
            let v = ["abc", "-1", "+5", " 5 ", "5, 6", "99999999999999999999999", "0x10"].choose(rng).unwrap();
            h("Content-Length", v.as_bytes());
            if rng.random_bool(0.5) {
                h("Content-Length", b"1");
            }
            framed = false;
        }
        94..98 => {
            h("Transfer-Encoding", b"chunked");
            body_bytes = chunked(rng, &body_bytes);
            // HTTP/1.0 has no chunked requests.
            if version == "HTTP/1.0" {
                framed = false;
            }
        }
        _ => {
            h("Transfer-Encoding", b"chunked");
            h("Content-Length", body_bytes.len().to_string().as_bytes());
            let mut c = chunked(rng, &body_bytes);
            if rng.random_bool(0.5) {
                c.truncate(c.len() / 2);
            } else {
                tail.extend(b"zz\r\n");
            }
            body_bytes = c;
            framed = false;
        }
    }

    let mut eol: &[u8] = b"\r\n";
    if rng.random_bool(0.02) {
        eol = b"\n";
        framed = false;
    }
    let mut bytes = Vec::with_capacity(body_bytes.len() + 512);
    bytes.extend(method.as_bytes());
    bytes.push(b' ');
    bytes.extend(path.as_bytes());
    bytes.push(b' ');
    bytes.extend(version.as_bytes());
    bytes.extend(eol);
    let head_bytes: usize = headers.iter().map(|(n, v)| n.len() + v.len() + 4).sum();
    if head_bytes > 250_000 {
        framed = false;
    }
    for (name, value) in &headers {
        bytes.extend(name.as_bytes());
        bytes.extend(b": ");
        bytes.extend(value);
        bytes.extend(eol);
    }
    bytes.extend(eol);
    let body_len = body_bytes.len();
    bytes.extend(body_bytes);
    bytes.extend(tail);
    if rng.random_bool(0.02) {
        // A request cut anywhere.
        let cut = rng.random_range(0..bytes.len());
        bytes.truncate(cut);
        framed = false;
    }
    what.insert(0, format!("{method:?} {}", path.chars().take(80).collect::<String>()));
    Fuzzed { bytes, framed, head, clean, body_len, what: what.join(", ") }
}

fn random_bytes(rng: &mut ChaCha8Rng, len: std::ops::Range<usize>) -> Vec<u8> {
    let n = rng.random_range(len);
    (0..n).map(|_| rng.random()).collect()
}

fn percent_encode_some(rng: &mut ChaCha8Rng, s: &str) -> String {
    s.bytes().map(|b| if b != b'/' && rng.random_bool(0.3) { format!("%{b:02X}") } else { char::from(b).to_string() }).collect()
}

fn chunked(rng: &mut ChaCha8Rng, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut rest = body;
    while !rest.is_empty() {
        let n = rng.random_range(1..=rest.len().min(4096));
        out.extend(format!("{n:x}\r\n").as_bytes());
        out.extend(&rest[..n]);
        out.extend(b"\r\n");
        rest = &rest[n..];
    }
    out.extend(b"0\r\n\r\n");
    out
}

fn short_text(rng: &mut ChaCha8Rng) -> String {
    let parts = ["hi", "Say one word.", "{{ 7*7 }}", "{% for %}", "<|im_end|>", "é", "😀", "\0", "\n", "\\", "\"", "Paris", " "];
    (0..rng.random_range(0..6)).map(|_| *parts.choose(rng).unwrap()).collect()
}

fn random_json(rng: &mut ChaCha8Rng, depth: u32) -> Value {
    match rng.random_range(0..if depth == 0 { 6 } else { 8 }) {
        0 => Value::Null,
        1 => json!(rng.random_bool(0.5)),
        2 => json!(rng.random::<i64>() >> rng.random_range(0..64u32)),
        3 => json!(rng.random::<f64>() * 1e6 - 5e5),
        4 => json!(short_text(rng)),
        5 => [json!(-1), json!(0), json!(1), json!(4), json!(1e300), json!(u64::MAX)].choose(rng).unwrap().clone(),
        6 => Value::Array((0..rng.random_range(0..4)).map(|_| random_json(rng, depth - 1)).collect()),
        _ => {
            let keys = ["role", "content", "type", "text", "messages", "prompt", "stop", "x", ""];
            Value::Object(
                (0..rng.random_range(0..4)).map(|_| (keys.choose(rng).unwrap().to_string(), random_json(rng, depth - 1))).collect(),
            )
        }
    }
}

fn valid_request(rng: &mut ChaCha8Rng, chat: bool) -> Value {
    let mut v = if chat {
        let n = rng.random_range(1..4);
        let messages: Vec<Value> = (0..n)
            .map(|_| {
                let role = ["user", "system", "assistant", "tool", "robot"].choose(rng).unwrap();
                json!({"role": role, "content": short_text(rng)})
            })
            .collect();
        json!({"messages": messages})
    } else {
        let prompt = match rng.random_range(0..4) {
            0 => json!([short_text(rng), short_text(rng)]),
            1 => json!([1, 2, 3, rng.random_range(0..60_000)]),
            _ => json!(short_text(rng)),
        };
        json!({"prompt": prompt})
    };
    let o = v.as_object_mut().unwrap();
    o.insert("max_tokens".into(), json!(rng.random_range(1..=4)));
    o.insert("temperature".into(), json!([0.0, 0.7, 2.0, -1.0].choose(rng).unwrap()));
    if rng.random_bool(0.3) {
        o.insert("stream".into(), json!(true));
        if rng.random_bool(0.5) {
            o.insert("stream_options".into(), json!({"include_usage": rng.random_bool(0.5)}));
        }
    }
    if rng.random_bool(0.2) {
        o.insert("stop".into(), if rng.random_bool(0.5) { json!(short_text(rng)) } else { json!([short_text(rng), "\n", ""]) });
    }
    if rng.random_bool(0.2) {
        o.insert("model".into(), json!(["SmolLM2-135M-Instruct.Q4_1", "gpt-4", "", "../etc"].choose(rng).unwrap()));
    }
    for key in ["seed", "top_p", "top_k", "n"] {
        if rng.random_bool(0.1) {
            o.insert(key.into(), random_json(rng, 0));
        }
    }
    v
}

/// Any JSON object that could generate is held to at most 4 tokens, whatever the
/// mutation made of `max_tokens`. Only the first JSON value is looked at and what follows
/// it is kept: a parser that stops there (and ignores trailing bytes) still sees the cap.
fn cap_tokens(rng: &mut ChaCha8Rng, body: Vec<u8>) -> Vec<u8> {
    let mut values = serde_json::Deserializer::from_slice(&body).into_iter::<Value>();
    match values.next() {
        Some(Ok(Value::Object(mut o))) if o.contains_key("messages") || o.contains_key("prompt") => {
            let rest = &body[values.byte_offset()..];
            o.insert("max_tokens".into(), json!(rng.random_range(0..=4)));
            o.remove("max_completion_tokens");
            let mut out = serde_json::to_vec(&o).unwrap();
            out.extend(rest);
            out
        }
        _ => body,
    }
}

fn fuzz_body(rng: &mut ChaCha8Rng, path: &str, what: &mut Vec<String>) -> Vec<u8> {
    let chat = if path.contains("chat") {
        true
    } else if path.contains("completions") {
        false
    } else {
        rng.random_bool(0.5)
    };
    if rng.random_bool(0.15) {
        return vec![];
    }
    let body = match rng.random_range(0..100) {
        0..30 => serde_json::to_vec(&valid_request(rng, chat)).unwrap(),
        30..45 => {
            // One field replaced by a value of any type.
            let mut v = valid_request(rng, chat);
            let o = v.as_object_mut().unwrap();
            let key = ["messages", "prompt", "temperature", "stop", "stream", "model", "top_p", "n", "seed"].choose(rng).unwrap();
            o.insert(key.to_string(), random_json(rng, 3));
            serde_json::to_vec(&v).unwrap()
        }
        45..70 => {
            let mut b = serde_json::to_vec(&valid_request(rng, chat)).unwrap();
            mutate_bytes(rng, &mut b);
            b
        }
        70..78 => random_bytes(rng, 0..512),
        78..84 => {
            let n = rng.random_range(100..100_000);
            what.push(format!("nesting {n}"));
            let (open, close) = if rng.random_bool(0.5) { ("[", "]") } else { ("{\"a\":", "}") };
            let prefix = if chat { "{\"messages\":" } else { "{\"prompt\":" };
            format!("{prefix}{}1{}}}", open.repeat(n), close.repeat(n)).into_bytes()
        }
        84..88 => {
            // Far past the context window: refused before any prefill.
            let n = rng.random_range(200_000..600_000);
            what.push(format!("huge content {n}"));
            let text = "hello world, ".repeat(n / 13);
            let v = if chat { json!({"messages": [{"role": "user", "content": text}]}) } else { json!({"prompt": text}) };
            serde_json::to_vec(&v).unwrap()
        }
        88..94 => serde_json::to_vec(&random_json(rng, 4)).unwrap(),
        _ => {
            let odd: &[&[u8]] = &[
                b"\xff\xfe{\0\"\0}\0",
                b"{\"messages\":[{\"role\":\"user\",\"content\":\"\\ud800\"}]}",
                b"{\"messages\":[{\"role\":\"user\",\"content\":\"\xc3\x28\"}]}",
                b"{\"prompt\":\"\\u0000\"}",
                b"{\"prompt\":\"a\"}{\"prompt\":\"b\"}",
                b"{\"prompt\":\"a\",\"prompt\":\"b\"}",
                b"\xef\xbb\xbf{\"prompt\":\"bom\"}",
                b"null",
                b"  ",
            ];
            odd.choose(rng).unwrap().to_vec()
        }
    };
    cap_tokens(rng, body)
}

fn mutate_bytes(rng: &mut ChaCha8Rng, b: &mut Vec<u8>) {
    for _ in 0..rng.random_range(1..6) {
        if b.is_empty() {
            b.push(rng.random());
            continue;
        }
        let at = rng.random_range(0..b.len());
        match rng.random_range(0..6) {
            0 => b[at] ^= 1 << rng.random_range(0..8),
            1 => b[at] = *b"{}[]\",:0\\".choose(rng).unwrap(),
            2 => {
                b.remove(at);
            }
            3 => b.insert(at, rng.random()),
            4 => b.truncate(at),
            _ => {
                let end = rng.random_range(at..=b.len().min(at + 32));
                let piece = b[at..end].to_vec();
                b.splice(at..at, piece);
            }
        }
    }
}
