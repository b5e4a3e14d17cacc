//! A real local HTTP server speaking the OpenAI chat-completions protocol, replaying a
//! script of replies in order (then answering 503), and keeping every request body it
//! received; `GET /v1/models` lists `scripted-coder`. One connection per request (`Connection: close`), plain HTTP/1.1 on
//! 127.0.0.1 with a free port.

#![allow(dead_code)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// One scripted answer.
#[derive(Debug, Clone)]
pub enum Reply {
    /// 200 with a completion whose choices have these contents.
    Choices { contents: Vec<String>, prompt_tokens: u64, completion_tokens: u64 },
    /// Any status with a body and optional Retry-After (seconds).
    Status { code: u16, retry_after: Option<u32>, body: String },
    /// 200 with this body verbatim (e.g. malformed JSON).
    Raw(String),
    /// Wait, then answer.
    Delay(Duration, Box<Reply>),
    /// 200 streaming this many bytes with no Content-Length.
    Huge(usize),
}

impl Reply {
    /// One choice with usage 1000 prompt + 200 completion tokens.
    pub fn text(content: &str) -> Reply {
        Reply::Choices { contents: vec![content.to_string()], prompt_tokens: 1000, completion_tokens: 200 }
    }
}

#[derive(Clone)]
pub struct ChatServer {
    pub port: u16,
    script: Arc<Mutex<std::collections::VecDeque<Reply>>>,
    /// Request bodies in arrival order (parsed JSON).
    pub requests: Arc<Mutex<Vec<serde_json::Value>>>,
    /// Authorization headers seen.
    pub auth: Arc<Mutex<Vec<Option<String>>>>,
}

impl ChatServer {
    /// Start serving `script` on a free port of 127.0.0.1 (on the current tokio runtime).
    pub async fn start(script: Vec<Reply>) -> ChatServer {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind 127.0.0.1:0");
        let port = listener.local_addr().unwrap().port();
        let server = ChatServer {
            port,
            script: Arc::new(Mutex::new(script.into())),
            requests: Arc::new(Mutex::new(Vec::new())),
            auth: Arc::new(Mutex::new(Vec::new())),
        };
        let s = server.clone();
        tokio::spawn(async move {
            loop {
                let Ok((sock, _)) = listener.accept().await else { return };
                let s = s.clone();
                tokio::spawn(async move {
                    let _ = s.serve(sock).await;
                });
            }
        });
        server
    }

    pub fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}/v1", self.port)
    }

    pub fn request_count(&self) -> usize {
        self.requests.lock().unwrap().len()
    }

    /// Append more replies to the script.
    pub fn push(&self, r: Reply) {
        self.script.lock().unwrap().push_back(r);
    }

    async fn serve(&self, mut sock: TcpStream) -> std::io::Result<()> {
        let mut buf = Vec::new();
        let mut chunk = [0u8; 8192];
        let header_end = loop {
            let n = sock.read(&mut chunk).await?;
            if n == 0 {
                return Ok(());
            }
            buf.extend_from_slice(&chunk[..n]);
            if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break p + 4;
            }
        };
        let head = String::from_utf8_lossy(&buf[..header_end]).to_string();
        let header = |name: &str| {
            head.lines()
                .find(|l| l.to_ascii_lowercase().starts_with(&format!("{}:", name.to_ascii_lowercase())))
                .map(|l| l.split_once(':').unwrap().1.trim().to_string())
        };
        let len: usize = header("content-length").and_then(|v| v.parse().ok()).unwrap_or(0);
        while buf.len() < header_end + len {
            let n = sock.read(&mut chunk).await?;
            if n == 0 {
                break;
            }
            buf.extend_from_slice(&chunk[..n]);
        }
        let body: serde_json::Value = serde_json::from_slice(&buf[header_end..]).unwrap_or(serde_json::Value::Null);
        if head.starts_with("GET /v1/models ") {
            let models = serde_json::json!({"object": "list", "data": [{"id": "scripted-coder", "object": "model"}]});
            return respond(&mut sock, 200, None, &models.to_string()).await;
        }
        let path_ok = head.starts_with("POST /v1/chat/completions ");
        self.requests.lock().unwrap().push(body);
        self.auth.lock().unwrap().push(header("authorization"));
        let mut reply = if path_ok {
            self.script.lock().unwrap().pop_front().unwrap_or(Reply::Status { code: 503, retry_after: None, body: "{\"error\":\"script exhausted\"}".into() })
        } else {
            Reply::Status { code: 404, retry_after: None, body: format!("{{\"error\":\"no route {}\"}}", head.lines().next().unwrap_or("")) }
        };
        while let Reply::Delay(d, then) = reply {
            tokio::time::sleep(d).await;
            reply = *then;
        }
        match reply {
            Reply::Choices { contents, prompt_tokens, completion_tokens } => {
                let choices: Vec<serde_json::Value> = contents
                    .iter()
                    .enumerate()
                    .map(|(i, c)| serde_json::json!({"index": i, "message": {"role": "assistant", "content": c}, "finish_reason": "stop"}))
                    .collect();
                let body = serde_json::json!({
                    "id": "chatcmpl-test", "object": "chat.completion", "model": "scripted",
                    "choices": choices,
                    "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens, "total_tokens": prompt_tokens + completion_tokens},
                });
                respond(&mut sock, 200, None, &body.to_string()).await
            }
            Reply::Status { code, retry_after, body } => respond(&mut sock, code, retry_after, &body).await,
            Reply::Raw(body) => respond(&mut sock, 200, None, &body).await,
            Reply::Huge(bytes) => {
                sock.write_all(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n{\"choices\":[{\"message\":{\"content\":\"").await?;
                let block = vec![b'x'; 64 * 1024];
                let mut sent = 0;
                while sent < bytes {
                    sock.write_all(&block).await?;
                    sent += block.len();
                }
                sock.shutdown().await
            }
            Reply::Delay(..) => unreachable!(),
        }
    }
}

async fn respond(sock: &mut TcpStream, code: u16, retry_after: Option<u32>, body: &str) -> std::io::Result<()> {
    let reason = match code {
        200 => "OK",
        404 => "Not Found",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "Status",
    };
    let extra = retry_after.map(|s| format!("Retry-After: {s}\r\n")).unwrap_or_default();
    let msg = format!(
        "HTTP/1.1 {code} {reason}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n{extra}Connection: close\r\n\r\n{body}",
        body.len()
    );
    sock.write_all(msg.as_bytes()).await?;
    sock.shutdown().await
}
