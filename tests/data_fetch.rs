//! `maporl::data::fetch` against a bounded HTTP/1.1 server on loopback that serves the
//! ../shared/data files at the public URLs' paths (the ANLI zip is built here). Never
//! touches the real internet.

use std::collections::HashMap;
use std::io::{Cursor, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use sha2::{Digest, Sha256};

const GSM8K_PATH: &str = "/openai/grade-school-math/master/grade_school_math/data/";
const ANLI_PATH: &str = "/anli/anli_v1.0.zip";
const ANLI_SPLITS: [&str; 6] = [
    "R1/dev", "R1/test", "R2/dev", "R2/test", "R3/dev", "R3/test",
];
/// The most requests one server answers before it stops.
const MAX_REQUESTS: usize = 16;

fn shared_data() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/data")
}

fn sha256(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// The sha256 the shared README gives for each file, keyed "gsm8k/train.jsonl",
/// "anli/R1/dev.jsonl", ...
fn readme_hashes() -> HashMap<String, String> {
    let readme = std::fs::read_to_string(shared_data().join("README.md")).unwrap();
    let mut hashes = HashMap::new();
    for line in readme.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        let last = words.last().copied().unwrap_or("");
        if last.len() != 64 || !last.bytes().all(|b| b.is_ascii_hexdigit()) {
            continue;
        }
        if words[0] == "-" {
            // "- train.jsonl 7473 lines, sha256 <hex>"
            hashes.insert(format!("gsm8k/{}", words[1]), last.to_string());
        } else if words.len() == 2 && words[0].starts_with('R') {
            // "  R1/dev <hex>"
            hashes.insert(format!("anli/{}.jsonl", words[0]), last.to_string());
        }
    }
    assert_eq!(hashes.len(), 8, "hashes parsed from the README: {hashes:?}");
    hashes
}

fn gsm8k_routes() -> HashMap<String, Vec<u8>> {
    ["train.jsonl", "test.jsonl"]
        .iter()
        .map(|name| {
            let bytes = std::fs::read(shared_data().join("gsm8k").join(name)).unwrap();
            (format!("{GSM8K_PATH}{name}"), bytes)
        })
        .collect()
}

/// The ANLI zip as the public one lays it out (anli_v1.0/R{n}/{split}.jsonl, deflated), from
/// the shared dev/test files; `tamper` may change a member's bytes.
fn anli_zip(tamper: impl Fn(&str, &mut Vec<u8>)) -> Vec<u8> {
    let options = zip::write::SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Deflated);
    let mut writer = zip::ZipWriter::new(Cursor::new(Vec::new()));
    for split in ANLI_SPLITS {
        let mut bytes = std::fs::read(shared_data().join(format!("anli/{split}.jsonl"))).unwrap();
        tamper(split, &mut bytes);
        writer
            .start_file(format!("anli_v1.0/{split}.jsonl"), options)
            .unwrap();
        writer.write_all(&bytes).unwrap();
    }
    // A small stand-in for R1's train split (the real ones are not in shared/data), which
    // has no pinned hash; R2 and R3 have none here.
    let dev = std::fs::read_to_string(shared_data().join("anli/R1/dev.jsonl")).unwrap();
    let train: String = dev.lines().take(50).map(|l| format!("{l}\n")).collect();
    writer
        .start_file("anli_v1.0/R1/train.jsonl", options)
        .unwrap();
    writer.write_all(train.as_bytes()).unwrap();
    writer.start_file("anli_v1.0/README.txt", options).unwrap();
    writer.write_all(b"not extracted\n").unwrap();
    writer.finish().unwrap().into_inner()
}

/// A tiny HTTP/1.1 server: one request per connection, at most `MAX_REQUESTS`, stops when
/// dropped. Unknown paths get 404. Logs each requested path.
struct Server {
    base_url: String,
    log: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Server {
    fn start(routes: HashMap<String, Vec<u8>>) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let base_url = format!("http://{}", listener.local_addr().unwrap());
        let log = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (log, stop) = (log.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut served = 0;
                while served < MAX_REQUESTS && !stop.load(Ordering::SeqCst) {
                    match listener.accept() {
                        Ok((stream, _)) => {
                            served += 1;
                            serve(stream, &routes, &log);
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                            std::thread::sleep(Duration::from_millis(5));
                        }
                        Err(e) => panic!("accept: {e}"),
                    }
                }
            })
        };
        Server {
            base_url,
            log,
            stop,
            thread: Some(thread),
        }
    }

    fn requests(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
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

/// Answers one request, logging its path first.
fn serve(
    mut stream: TcpStream,
    routes: &HashMap<String, Vec<u8>>,
    log: &Mutex<Vec<String>>,
) -> Option<()> {
    stream.set_nonblocking(false).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .ok()?;
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if stream.read(&mut byte).ok()? == 0 || head.len() > 16 * 1024 {
            return None;
        }
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head);
    let mut request_line = head.lines().next()?.split_whitespace();
    let (method, path) = (request_line.next()?, request_line.next()?.to_string());
    let (status, body): (&str, &[u8]) = match routes.get(&path) {
        Some(body) if method == "GET" => ("200 OK", body),
        _ => ("404 Not Found", b"not found\n"),
    };
    let header = format!(
        "HTTP/1.1 {status}\r\nContent-Length: {}\r\nContent-Type: application/octet-stream\r\n\
         Connection: close\r\n\r\n",
        body.len()
    );
    // Logged before the answer leaves: a client that has its answer (and may have exited)
    // never finds its request missing from the log.
    log.lock().unwrap().push(path);
    stream.write_all(header.as_bytes()).ok()?;
    stream.write_all(body).ok()?;
    stream.flush().ok()
}

/// Files under `dir`, recursively, relative to it, sorted.
fn files_under(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for entry in entries {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else {
                let rel = path.strip_prefix(dir).unwrap();
                out.push(rel.to_string_lossy().replace('\\', "/"));
            }
        }
    }
    out.sort();
    out
}

fn file_sha256(path: &Path) -> String {
    sha256(&std::fs::read(path).unwrap())
}

#[test]
fn fetches_both_datasets_verifies_and_skips_what_is_present() {
    let hashes = readme_hashes();
    let mut routes = gsm8k_routes();
    routes.insert(ANLI_PATH.into(), anli_zip(|_, _| {}));
    let server = Server::start(routes);
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();

    let gsm8k = maporl::data::fetch("gsm8k", dir, Some(&server.base_url)).unwrap();
    assert_eq!(
        gsm8k,
        [dir.join("gsm8k/train.jsonl"), dir.join("gsm8k/test.jsonl")]
    );
    let anli = maporl::data::fetch("anli", dir, Some(&format!("{}/", server.base_url))).unwrap();
    let mut expected_anli: Vec<PathBuf> = ANLI_SPLITS
        .iter()
        .map(|s| dir.join(format!("anli/{s}.jsonl")))
        .collect();
    expected_anli.insert(2, dir.join("anli/R1/train.jsonl"));
    assert_eq!(anli, expected_anli);
    assert_eq!(
        server.requests(),
        [
            format!("{GSM8K_PATH}train.jsonl"),
            format!("{GSM8K_PATH}test.jsonl"),
            ANLI_PATH.to_string(),
        ]
    );

    for (name, hash) in &hashes {
        assert_eq!(&file_sha256(&dir.join(name)), hash, "{name}");
    }
    // Nothing but the data and the ANLI manifest; no temp files, no README.txt.
    let mut expected_files: Vec<String> = hashes.keys().cloned().collect();
    expected_files.push("anli/SHA256SUMS".into());
    expected_files.push("anli/R1/train.jsonl".into());
    expected_files.sort();
    assert_eq!(files_under(dir), expected_files);

    let count = |f: fn(&Path) -> anyhow::Result<Vec<maporl::transcript::Task>>, p: &str| {
        f(&dir.join(p)).unwrap().len()
    };
    assert_eq!(count(maporl::data::gsm8k, "gsm8k/test.jsonl"), 1319);
    assert_eq!(count(maporl::data::gsm8k, "gsm8k/train.jsonl"), 7473);
    assert_eq!(count(maporl::data::anli, "anli/R3/test.jsonl"), 1200);
    assert_eq!(count(maporl::data::anli, "anli/R1/dev.jsonl"), 1000);
    assert_eq!(count(maporl::data::anli, "anli/R1/train.jsonl"), 50);
    // The unpinned train split's hash is recorded, so later fetches can check it.
    let manifest = std::fs::read_to_string(dir.join("anli/SHA256SUMS")).unwrap();
    let train_hash = file_sha256(&dir.join("anli/R1/train.jsonl"));
    assert!(
        manifest.contains(&format!("{train_hash}  R1/train.jsonl")),
        "{manifest}"
    );

    // A second fetch finds everything in place and downloads nothing.
    let again = maporl::data::fetch("gsm8k", dir, Some(&server.base_url)).unwrap();
    assert_eq!(again, gsm8k);
    let again = maporl::data::fetch("anli", dir, Some(&server.base_url)).unwrap();
    assert_eq!(again, anli);
    assert_eq!(server.requests().len(), 3, "{:?}", server.requests());

    // A file damaged on disk is fetched again (and only that dataset's request is made).
    std::fs::write(dir.join("gsm8k/test.jsonl"), b"damaged\n").unwrap();
    maporl::data::fetch("gsm8k", dir, Some(&server.base_url)).unwrap();
    assert_eq!(server.requests().len(), 4);
    assert_eq!(
        server.requests()[3],
        format!("{GSM8K_PATH}test.jsonl"),
        "only the damaged file is downloaded"
    );
    assert_eq!(
        file_sha256(&dir.join("gsm8k/test.jsonl")),
        hashes["gsm8k/test.jsonl"]
    );
}

#[test]
fn corrupt_download_is_a_sha256_error_and_leaves_no_file() {
    let hashes = readme_hashes();
    let mut routes = gsm8k_routes();
    let path = format!("{GSM8K_PATH}test.jsonl");
    let bad = routes.get_mut(&path).unwrap();
    bad[10] ^= 1;
    let bad_hash = sha256(bad);
    routes.insert(
        ANLI_PATH.into(),
        anli_zip(|split, bytes| {
            if split == "R2/test" {
                bytes.truncate(bytes.len() / 2);
            }
        }),
    );
    let server = Server::start(routes);
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();

    let err = maporl::data::fetch("gsm8k", dir, Some(&server.base_url)).unwrap_err();
    let msg = format!("{err:#}");
    eprintln!("error: {msg}");
    assert!(msg.contains("sha256"), "{msg}");
    assert!(msg.contains("test.jsonl"), "{msg}");
    assert!(msg.contains(&hashes["gsm8k/test.jsonl"]), "{msg}");
    assert!(msg.contains(&bad_hash), "{msg}");
    assert!(!dir.join("gsm8k/test.jsonl").exists());
    // train.jsonl was good and is kept; nothing else (no temp file) is left.
    assert_eq!(files_under(dir), ["gsm8k/train.jsonl"]);

    // One bad member in the ANLI zip: nothing from the zip is written.
    let err = maporl::data::fetch("anli", dir, Some(&server.base_url)).unwrap_err();
    let msg = format!("{err:#}");
    eprintln!("error: {msg}");
    assert!(msg.contains("sha256"), "{msg}");
    assert!(msg.contains("R2/test.jsonl"), "{msg}");
    assert!(msg.contains(&hashes["anli/R2/test.jsonl"]), "{msg}");
    assert_eq!(files_under(dir), ["gsm8k/train.jsonl"]);
}

#[test]
fn http_errors_name_the_url_and_status() {
    let mut routes = gsm8k_routes();
    routes.remove(&format!("{GSM8K_PATH}train.jsonl"));
    let server = Server::start(routes);
    let tmp = tempfile::tempdir().unwrap();

    let err = maporl::data::fetch("gsm8k", tmp.path(), Some(&server.base_url)).unwrap_err();
    let msg = format!("{err:#}");
    eprintln!("error: {msg}");
    let url = format!("{}{GSM8K_PATH}train.jsonl", server.base_url);
    assert!(msg.contains(&url), "{msg}");
    assert!(msg.contains("404"), "{msg}");
    let err = maporl::data::fetch("anli", tmp.path(), Some(&server.base_url)).unwrap_err();
    let msg = format!("{err:#}");
    eprintln!("error: {msg}");
    assert!(
        msg.contains(&format!("{}{ANLI_PATH}", server.base_url)),
        "{msg}"
    );
    assert!(msg.contains("404"), "{msg}");
    assert_eq!(files_under(tmp.path()), Vec::<String>::new());

    // Nothing listening: the error names the URL.
    let closed = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", l.local_addr().unwrap())
    };
    let err = maporl::data::fetch("gsm8k", tmp.path(), Some(&closed)).unwrap_err();
    let msg = format!("{err:#}");
    eprintln!("error: {msg}");
    assert!(msg.contains(&format!("{closed}{GSM8K_PATH}")), "{msg}");
}

#[test]
fn unknown_dataset_lists_the_known_ones() {
    let tmp = tempfile::tempdir().unwrap();
    let err = maporl::data::fetch("mnist", tmp.path(), Some("http://127.0.0.1:9")).unwrap_err();
    let msg = format!("{err:#}");
    eprintln!("error: {msg}");
    assert!(
        msg.contains("mnist") && msg.contains("gsm8k") && msg.contains("anli"),
        "{msg}"
    );
}

// A hostile host (or mirror) on loopback, through the `maporl` binary: what it says reaches
// the terminal escaped and cut short, a file of another size than pinned or over the cap is
// refused leaving nothing, and a server that trickles is cut off at the deadline.

mod support;

use support::hostile::{self, Answer};

/// `maporl data fetch DATASET DIR` from the mirror `server`, with `envs`.
fn fetch_from(
    server: &hostile::Server,
    dataset: &str,
    dir: &Path,
    envs: &[(&str, &str)],
) -> (bool, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_maporl"))
        .args(["data", "fetch", dataset])
        .arg(dir)
        .env("MAPORL_DATA_MIRROR", server.url())
        .env_remove("MAPORL_HTTP_TIMEOUT")
        .env_remove("MAPORL_HTTP_MIN_RATE")
        .envs(envs.iter().copied())
        .output()
        .expect("running maporl");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// A host answering GSM8K's train.jsonl (the first file fetched) and the ANLI zip with
/// `answer`, anything else with 404.
fn hostile_host(answer: Answer) -> hostile::Server {
    hostile::Server::start(move |r| {
        let path = r.path();
        if path == format!("{GSM8K_PATH}train.jsonl") || path == ANLI_PATH {
            answer.clone()
        } else {
            Answer::new(404, "")
        }
    })
}

const TRAIN_BYTES: usize = 4_166_206;

/// Environment variables for a command.
type Vars = &'static [(&'static str, &'static str)];

/// A whole-request deadline of 2 s (and a negligible one a byte).
const TRICKLE: Vars = &[
    ("MAPORL_HTTP_TIMEOUT", "2"),
    ("MAPORL_HTTP_MIN_RATE", "1000000000"),
];

#[test]
fn a_hostile_hosts_words_sizes_and_trickles_are_refused_leaving_nothing() {
    use std::time::Instant;
    let megabyte: Vec<u8> = hostile::HOSTILE_TEXT
        .as_bytes()
        .iter()
        .copied()
        .cycle()
        .take(1 << 20)
        .collect();
    let gap = Duration::from_millis(100);
    // (what, the host, the dataset, environment, what the error must say)
    let cases: Vec<(&str, hostile::Server, &str, Vars, &str)> = vec![
        (
            "an error body",
            hostile_host(Answer::new(404, hostile::hostile_body(100_000))),
            "gsm8k",
            &[],
            "HTTP 404",
        ),
        (
            "a megabyte error body, unframed",
            hostile_host(Answer::new(500, megabyte.clone()).unframed()),
            "anli",
            &[],
            "HTTP 500",
        ),
        (
            "a Content-Length other than the pinned size",
            hostile_host(Answer::new(200, vec![b'x'; 10 << 20])),
            "gsm8k",
            &[],
            "announces 10485760 bytes (Content-Length), but the file is 4166206 bytes; \
             refused before writing",
        ),
        (
            "a byte more than the pinned size, unframed",
            hostile_host(Answer::new(200, vec![b'x'; TRAIN_BYTES + 1]).unframed()),
            "gsm8k",
            &[],
            "more than 4166206 bytes, but the file is 4166206 bytes; cut there and refused",
        ),
        (
            "less than the pinned size, unframed",
            hostile_host(Answer::new(200, vec![b'x'; 1000]).unframed()),
            "gsm8k",
            &[],
            "sent 1000 bytes, but the file is 4166206 bytes",
        ),
        (
            "a zip announced over the cap",
            hostile_host(Answer::new(200, vec![b'x'; 1000]).header("Content-Length", "314572800")),
            "anli",
            &[],
            "the limit is 268435456 bytes (256 MiB); refused before writing",
        ),
        (
            "a trickled body",
            hostile_host(Answer::new(200, vec![b'x'; TRAIN_BYTES]).trickle_body(gap)),
            "gsm8k",
            TRICKLE,
            "deadline of 2.0 s",
        ),
        (
            "a trickled status line",
            hostile_host(Answer::new(200, vec![b'x'; 1000]).trickle_all(gap)),
            "anli",
            TRICKLE,
            "deadline of 2.3 s",
        ),
    ];
    for (what, server, dataset, envs, says) in cases {
        let tmp = tempfile::tempdir().unwrap();
        let started = Instant::now();
        let (ok, out) = fetch_from(&server, dataset, tmp.path(), envs);
        let took = started.elapsed();
        eprintln!("--- {what} ({took:?}):\n{out}");
        assert!(!ok, "{what}: the fetch succeeded:\n{out}");
        assert!(out.contains(says), "{what}: no {says:?} in:\n{out}");
        hostile::assert_terminal_safe(&out, 3000);
        if what.contains("error body") {
            assert!(out.contains("\\u{1b}"), "{what}: {out}");
        }
        assert!(
            !out.contains(&"A".repeat(400)),
            "{what}: not cut short: {out}"
        );
        assert_eq!(files_under(tmp.path()), Vec::<String>::new(), "{what}");
        // Generous for a loaded machine, far below the minute a trickle lasts.
        assert!(took < Duration::from_secs(20), "{what}: took {took:?}");
    }
}
