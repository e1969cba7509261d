//! A hostile HTTP/1.1 server on loopback, for the tests of registries, the hub and dataset
//! hosts: a handler answers each request, and may send an error body full of escape
//! sequences, another size than it announced, a body with no framing at all, or trickle its
//! answer a byte at a time. Also: running a command and reading its peak memory, and what
//! "safe for a terminal" means in the assertions.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// What a server says to make a terminal misbehave: set the window title, clear the screen,
/// move the cursor home, start a line that passes for the host's, reorder text, an 8-bit CSI.
pub const HOSTILE_TEXT: &str =
    "\x1b]0;pwned\x07\x1b[2J\x1b[H\r\nerror: forged by the server\n\u{202e}gnp.exe\u{9b}31m\x1b[0m";

/// [`HOSTILE_TEXT`] followed by `pad` bytes of `A`.
pub fn hostile_body(pad: usize) -> Vec<u8> {
    let mut body = HOSTILE_TEXT.as_bytes().to_vec();
    body.extend(std::iter::repeat_n(b'A', pad));
    body
}

/// Asserts that `out` (what a command printed, or an error message) holds no character a
/// terminal acts on but line breaks, no line a server forged, and at most `max` bytes.
pub fn assert_terminal_safe(out: &str, max: usize) {
    let bad = out.chars().find(|&c| {
        (c.is_control() && c != '\n')
            || matches!(
                c,
                '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}'
                    | '\u{2028}' | '\u{2029}' | '\u{061c}'
            )
    });
    assert!(bad.is_none(), "{bad:?} reached the terminal in:\n{out:?}");
    assert!(
        !out.lines()
            .any(|l| l.trim_start().starts_with("error: forged")),
        "a forged line:\n{out}"
    );
    assert!(
        out.len() <= max,
        "{} bytes printed, over {max}:\n{}",
        out.len(),
        &out[..out.floor_char_boundary(4000)]
    );
}

/// How an answer's body is framed and sent.
#[derive(Clone, Copy, Debug)]
pub enum Framing {
    /// `Content-Length` (unless the headers give one, true or not), then the body.
    Length,
    /// No `Content-Length`: the body, then the connection closes.
    Unframed,
    /// The head at once, then the body one byte every so often (with `Content-Length`).
    TrickleBody(Duration),
    /// Everything, the status line included, one byte every so often.
    TrickleAll(Duration),
}

/// One answer.
#[derive(Clone, Debug)]
pub struct Answer {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    pub framing: Framing,
    /// How long the server waits before it answers.
    pub delay: Duration,
}

impl Answer {
    pub fn new(status: u16, body: impl Into<Vec<u8>>) -> Answer {
        Answer {
            status,
            headers: Vec::new(),
            body: body.into(),
            framing: Framing::Length,
            delay: Duration::ZERO,
        }
    }

    pub fn after(mut self, delay: Duration) -> Answer {
        self.delay = delay;
        self
    }

    pub fn header(mut self, name: &str, value: impl Into<String>) -> Answer {
        self.headers.push((name.to_string(), value.into()));
        self
    }

    pub fn unframed(mut self) -> Answer {
        self.framing = Framing::Unframed;
        self
    }

    pub fn trickle_body(mut self, gap: Duration) -> Answer {
        self.framing = Framing::TrickleBody(gap);
        self
    }

    pub fn trickle_all(mut self, gap: Duration) -> Answer {
        self.framing = Framing::TrickleAll(gap);
        self
    }
}

/// A request as the handler sees it.
#[derive(Clone, Debug)]
pub struct Request {
    pub method: String,
    /// The request target: path and query.
    pub target: String,
    /// Names in lower case.
    pub headers: Vec<(String, String)>,
}

impl Request {
    pub fn path(&self) -> &str {
        self.target.split('?').next().unwrap_or("")
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

type Handler = dyn Fn(&Request) -> Answer + Send + Sync;

/// The server: one thread per connection, one request per connection; stops when dropped.
/// A trickle gives up after a minute, so a client that never stops listening fails its
/// test instead of hanging it.
pub struct Server {
    pub addr: String,
    log: Arc<Mutex<Vec<Request>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Server {
    pub fn start(handler: impl Fn(&Request) -> Answer + Send + Sync + 'static) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let log: Arc<Mutex<Vec<Request>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let handler: Arc<Handler> = Arc::new(handler);
        let thread = {
            let (log, stop) = (log.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    match listener.accept() {
                        Ok((stream, _)) => {
                            let (log, stop, handler) = (log.clone(), stop.clone(), handler.clone());
                            std::thread::spawn(move || serve(stream, &*handler, &log, &stop));
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                            std::thread::sleep(Duration::from_millis(2));
                        }
                        Err(e) => panic!("accept: {e}"),
                    }
                }
            })
        };
        Server {
            addr,
            log,
            stop,
            thread: Some(thread),
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The requests so far: (method, target).
    pub fn requests(&self) -> Vec<(String, String)> {
        self.log
            .lock()
            .unwrap()
            .iter()
            .map(|r| (r.method.clone(), r.target.clone()))
            .collect()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn serve(stream: TcpStream, handler: &Handler, log: &Mutex<Vec<Request>>, stop: &AtomicBool) {
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    if reader.read_line(&mut line).is_err() || line.trim().is_empty() {
        return;
    }
    let mut parts = line.split_whitespace();
    let (method, target) = (
        parts.next().unwrap_or("").to_string(),
        parts.next().unwrap_or("").to_string(),
    );
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h).is_err() {
            return;
        }
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
    }
    let len: usize = headers
        .iter()
        .find(|(k, _)| k == "content-length")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    let mut body = vec![0; len.min(256 << 20)];
    if reader.read_exact(&mut body).is_err() {
        return;
    }
    let request = Request {
        method,
        target,
        headers,
    };
    let answer = handler(&request);
    std::thread::sleep(answer.delay);
    // Logged before the answer leaves: a client that has its answer (and may have exited)
    // never finds its request missing from the log.
    log.lock().unwrap().push(request.clone());
    let mut head = format!("HTTP/1.1 {} Whatever\r\n", answer.status);
    let has_length = answer
        .headers
        .iter()
        .any(|(k, _)| k.eq_ignore_ascii_case("content-length"));
    for (k, v) in &answer.headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    if !has_length && !matches!(answer.framing, Framing::Unframed) {
        head.push_str(&format!("Content-Length: {}\r\n", answer.body.len()));
    }
    head.push_str("Connection: close\r\n\r\n");
    let body: &[u8] = if request.method == "HEAD" {
        &[]
    } else {
        &answer.body
    };
    let mut stream = reader.into_inner();
    let trickle = |stream: &mut TcpStream, bytes: &[u8], gap: Duration| {
        let started = Instant::now();
        for b in bytes {
            if stop.load(Ordering::SeqCst) || started.elapsed() > Duration::from_secs(60) {
                return false;
            }
            if stream
                .write_all(&[*b])
                .and_then(|_| stream.flush())
                .is_err()
            {
                return false; // the client gave up
            }
            std::thread::sleep(gap);
        }
        true
    };
    match answer.framing {
        Framing::Length | Framing::Unframed => {
            let _ = stream
                .write_all(head.as_bytes())
                .and_then(|_| stream.write_all(body));
        }
        Framing::TrickleBody(gap) => {
            if stream.write_all(head.as_bytes()).is_ok() {
                trickle(&mut stream, body, gap);
            }
        }
        Framing::TrickleAll(gap) => {
            let mut all = head.into_bytes();
            all.extend_from_slice(body);
            trickle(&mut stream, &all, gap);
        }
    }
    let _ = stream.flush();
}

/// Runs `cmd` to its end and returns what it printed and its peak resident memory in bytes:
/// the highest VmHWM read from /proc/PID/status, read every millisecond while it runs
/// (VmHWM only grows, so the last reading holds all but the last millisecond; a test makes
/// the command live a while after the moment it measures). `ru_maxrss` from `wait4` would
/// not do: it counts the memory of this test process, which the child started as a copy of.
#[cfg(target_os = "linux")]
pub fn output_and_peak_memory(cmd: &mut Command) -> (Output, u64) {
    use std::process::Stdio;
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting the command");
    let read = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            let _ = pipe.read_to_end(&mut bytes);
            bytes
        })
    };
    let stdout = read(Box::new(child.stdout.take().unwrap()));
    let stderr = read(Box::new(child.stderr.take().unwrap()));
    let status_file = format!("/proc/{}/status", child.id());
    let mut peak_kib = 0u64;
    let status = loop {
        // Before the exit is seen: a process that has exited has no VmHWM any more.
        if let Ok(text) = std::fs::read_to_string(&status_file) {
            let hwm = text
                .lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok());
            peak_kib = peak_kib.max(hwm.unwrap_or(0));
        }
        if let Some(status) = child.try_wait().expect("waiting for the command") {
            break status;
        }
        std::thread::sleep(Duration::from_millis(1));
    };
    assert!(peak_kib > 0, "no VmHWM was read for the command");
    let output = Output {
        status,
        stdout: stdout.join().unwrap(),
        stderr: stderr.join().unwrap(),
    };
    (output, peak_kib * 1024)
}
