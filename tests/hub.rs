//! Models by hub name (`hf:ORG/NAME[@REVISION]`) against a loopback server that answers as
//! the Hugging Face hub does: `/ORG/NAME/resolve/REV/FILE` with X-Repo-Commit and ETags,
//! LFS files redirected to a `/cdn/<sha256>` path with X-Linked-Etag/X-Linked-Size, Range
//! requests honoured there. Never touches the real network.

mod support;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::Duration;

use maporl::model::hub::{Hub, HubModel};
use sha2::{Digest, Sha256};
use support::*;

const ORG: &str = "tiny-org";
const NAME: &str = "tiny-qwen2";
const SHARDED: &str = "tiny-qwen2-sharded";
const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

fn sha256(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// The tiny Qwen2's files (config, tokenizer files, model.safetensors) plus a
/// generation_config.json; made once per test binary.
fn tiny_files() -> &'static BTreeMap<String, Vec<u8>> {
    static FILES: OnceLock<BTreeMap<String, Vec<u8>>> = OnceLock::new();
    FILES.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        write_tiny_qwen2(dir.path());
        let mut files = BTreeMap::new();
        for entry in std::fs::read_dir(dir.path()).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            files.insert(name, std::fs::read(&path).unwrap());
        }
        files.insert(
            "generation_config.json".into(),
            br#"{"do_sample": true, "temperature": 0.7}"#.to_vec(),
        );
        for required in [
            "config.json",
            "tokenizer.json",
            "tokenizer_config.json",
            "model.safetensors",
        ] {
            assert!(files.contains_key(required), "{required}");
        }
        files
    })
}

/// The same model with its weights in two shards and an index, as large models ship.
fn sharded_files() -> BTreeMap<String, Vec<u8>> {
    use candle_core::{safetensors, Device};
    let mut files = tiny_files().clone();
    let dir = tempfile::tempdir().unwrap();
    let single = dir.path().join("model.safetensors");
    std::fs::write(&single, files.remove("model.safetensors").unwrap()).unwrap();
    let tensors = safetensors::load(&single, &Device::Cpu).unwrap();
    let mut names: Vec<&String> = tensors.keys().collect();
    names.sort();
    let half = names.len() / 2;
    let mut weight_map = serde_json::Map::new();
    for (i, part) in [&names[..half], &names[half..]].into_iter().enumerate() {
        let shard = format!("model-0000{}-of-00002.safetensors", i + 1);
        let map: std::collections::HashMap<String, candle_core::Tensor> = part
            .iter()
            .map(|n| ((*n).clone(), tensors[*n].clone()))
            .collect();
        let path = dir.path().join(&shard);
        safetensors::save(&map, &path).unwrap();
        files.insert(shard.clone(), std::fs::read(&path).unwrap());
        for n in part {
            weight_map.insert((*n).clone(), shard.clone().into());
        }
    }
    let index = serde_json::json!({"metadata": {}, "weight_map": weight_map});
    files.insert(
        "model.safetensors.index.json".into(),
        index.to_string().into_bytes(),
    );
    files
}

fn is_lfs(file: &str) -> bool {
    file.ends_with(".safetensors")
}

/// The ETag the hub gives a file: the sha256 for LFS files, a git-like 40-hex id otherwise.
fn etag_of(file: &str, bytes: &[u8]) -> String {
    if is_lfs(file) {
        sha256(bytes)
    } else {
        sha256(bytes)[..40].to_string()
    }
}

/// How the server misbehaves.
#[derive(Clone, Default)]
struct Quirks {
    /// The CDN serves other bytes (same length) for LFS files.
    corrupt: bool,
    /// The CDN ignores Range and always answers 200 with the whole file.
    ignore_range: bool,
    /// This ETag (raw header value) for config.json.
    etag: Option<String>,
    /// This X-Linked-Size for LFS files.
    linked_size: Option<u64>,
    /// The CDN sends this many bytes more than the file has, close-delimited.
    extra_bytes: usize,
    /// The shard index names this shard instead of the real first one.
    shard_name: Option<String>,
}

#[derive(Clone, Debug)]
struct Request {
    method: String,
    path: String,
    range: Option<String>,
    authorization: Option<String>,
}

/// A loopback hub holding `repos` (name -> files) under `ORG`, all at `COMMIT`: one request
/// per connection, stops when dropped; logs every request.
struct Server {
    base_url: String,
    log: Arc<Mutex<Vec<Request>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Server {
    fn start(repos: BTreeMap<String, BTreeMap<String, Vec<u8>>>, quirks: Quirks) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let base_url = format!("http://{}", listener.local_addr().unwrap());
        let log = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (log, stop, base) = (log.clone(), stop.clone(), base_url.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    match listener.accept() {
                        Ok((stream, _)) => {
                            serve(stream, &base, &repos, &quirks, &log);
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
            base_url,
            log,
            stop,
            thread: Some(thread),
        }
    }

    fn tiny(quirks: Quirks) -> Server {
        Server::start(
            BTreeMap::from([(NAME.to_string(), tiny_files().clone())]),
            quirks,
        )
    }

    fn requests(&self) -> Vec<Request> {
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

/// Answers one request, logging it first.
fn serve(
    mut stream: TcpStream,
    base: &str,
    repos: &BTreeMap<String, BTreeMap<String, Vec<u8>>>,
    quirks: &Quirks,
    log: &Mutex<Vec<Request>>,
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
    let head = String::from_utf8_lossy(&head).into_owned();
    let mut lines = head.lines();
    let mut request_line = lines.next()?.split_whitespace();
    let (method, path) = (
        request_line.next()?.to_string(),
        request_line.next()?.to_string(),
    );
    let header = |name: &str| {
        head.lines().skip(1).find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim()
                .eq_ignore_ascii_case(name)
                .then(|| v.trim().to_string())
        })
    };
    let request = Request {
        method: method.clone(),
        path: path.clone(),
        range: header("range"),
        authorization: header("authorization"),
    };
    let mut headers: Vec<(String, String)> = Vec::new();
    let mut status = "200 OK";
    let mut body: Vec<u8> = Vec::new();
    let mut close_delimited = false;

    let all: BTreeMap<String, (String, Vec<u8>)> = repos
        .values()
        .flatten()
        .map(|(f, b)| (etag_of(f, b), (f.clone(), b.clone())))
        .collect();
    let parts: Vec<&str> = path.trim_start_matches('/').splitn(5, '/').collect();
    if let (["cdn", sha], true) = (parts.as_slice(), method == "GET") {
        match all.get(*sha) {
            Some((_, bytes)) => {
                let mut bytes = bytes.clone();
                if quirks.corrupt {
                    for b in bytes.iter_mut().step_by(97) {
                        *b ^= 0x5a;
                    }
                }
                let from = request
                    .range
                    .as_deref()
                    .and_then(|r| r.strip_prefix("bytes="))
                    .and_then(|r| r.strip_suffix('-'))
                    .and_then(|n| n.parse::<usize>().ok());
                match from.filter(|_| !quirks.ignore_range) {
                    Some(from) if from < bytes.len() => {
                        status = "206 Partial Content";
                        headers.push((
                            "Content-Range".into(),
                            format!("bytes {from}-{}/{}", bytes.len() - 1, bytes.len()),
                        ));
                        body = bytes[from..].to_vec();
                    }
                    Some(_) => status = "416 Range Not Satisfiable",
                    None => body = bytes,
                }
                if quirks.extra_bytes > 0 {
                    body.extend(std::iter::repeat_n(7u8, quirks.extra_bytes));
                    close_delimited = true;
                }
            }
            None => status = "404 Not Found",
        }
    } else if let ([org, name, "resolve", rev, file], true) =
        (parts.as_slice(), method == "GET" || method == "HEAD")
    {
        match repos.get(*name).filter(|_| *org == ORG) {
            None => {
                status = "401 Unauthorized";
                headers.push(("X-Error-Code".into(), "RepoNotFound".into()));
                headers.push(("X-Error-Message".into(), "Repository not found".into()));
            }
            Some(_) if *rev != "main" && *rev != COMMIT => {
                status = "404 Not Found";
                headers.push(("X-Error-Code".into(), "RevisionNotFound".into()));
            }
            Some(files) => {
                headers.push(("X-Repo-Commit".into(), COMMIT.into()));
                let mut files = files.clone();
                if let (Some(shard), Some(index)) = (
                    &quirks.shard_name,
                    files.get("model.safetensors.index.json"),
                ) {
                    let text = String::from_utf8(index.clone())
                        .unwrap()
                        .replace("model-00001-of-00002.safetensors", shard);
                    files.insert("model.safetensors.index.json".into(), text.into_bytes());
                }
                match files.get(*file) {
                    None => {
                        status = "404 Not Found";
                        headers.push(("X-Error-Code".into(), "EntryNotFound".into()));
                    }
                    Some(bytes) if is_lfs(file) => {
                        let sha = sha256(bytes);
                        status = "302 Found";
                        headers.push(("Location".into(), format!("{base}/cdn/{sha}")));
                        headers.push(("X-Linked-Etag".into(), format!("\"{sha}\"")));
                        let size = quirks.linked_size.unwrap_or(bytes.len() as u64);
                        headers.push(("X-Linked-Size".into(), size.to_string()));
                        headers.push(("ETag".into(), "\"redirect-etag\"".into()));
                    }
                    Some(bytes) => {
                        let etag = match (&quirks.etag, *file) {
                            (Some(etag), "config.json") => etag.clone(),
                            _ => format!("\"{}\"", etag_of(file, bytes)),
                        };
                        headers.push(("ETag".into(), etag));
                        body = bytes.clone();
                    }
                }
            }
        }
    } else {
        status = "404 Not Found";
    }

    let mut response = format!("HTTP/1.1 {status}\r\n");
    for (k, v) in &headers {
        response.push_str(&format!("{k}: {v}\r\n"));
    }
    if !close_delimited {
        response.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    response.push_str("Connection: close\r\n\r\n");
    // Logged before the answer leaves: a client that has its answer (and may have exited)
    // never finds its request missing from the log.
    log.lock().unwrap().push(request);
    stream.write_all(response.as_bytes()).ok()?;
    if method != "HEAD" {
        stream.write_all(&body).ok()?;
    }
    stream.flush().ok()
}

fn hub(server: &Server, cache: &Path) -> Hub {
    hub_at(&server.base_url, cache)
}

fn hub_at(endpoint: &str, cache: &Path) -> Hub {
    Hub {
        cache: cache.to_path_buf(),
        endpoint: endpoint.to_string(),
        token: None,
        offline: false,
        max_file_bytes: maporl::model::hub::MAX_FILE_BYTES,
        deadline: maporl::net::Deadline::default(),
    }
}

fn model(name: &str) -> HubModel {
    HubModel::parse(&format!("hf:{ORG}/{name}")).unwrap()
}

/// Files under `dir`, recursively, relative to it, sorted (symlinks listed, not followed).
fn files_under(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for entry in entries {
            let entry = entry.unwrap();
            let path = entry.path();
            if entry.file_type().unwrap().is_dir() {
                stack.push(path);
            } else {
                let rel = path.strip_prefix(dir).unwrap();
                out.push(rel.to_string_lossy().into_owned());
            }
        }
    }
    out.sort();
    out
}

/// Checks the huggingface_hub layout of `files` in `cache` at COMMIT, for `name`.
fn assert_layout(cache: &Path, name: &str, files: &BTreeMap<String, Vec<u8>>) {
    let repo = cache.join(format!("models--{ORG}--{name}"));
    let snapshot = repo.join("snapshots").join(COMMIT);
    assert_eq!(
        std::fs::read_to_string(repo.join("refs/main")).unwrap(),
        COMMIT
    );
    let mut expected_blobs = Vec::new();
    for (file, bytes) in files {
        let etag = etag_of(file, bytes);
        let link = snapshot.join(file);
        assert_eq!(
            std::fs::read_link(&link).unwrap(),
            Path::new("../../blobs").join(&etag),
            "{file}"
        );
        assert_eq!(&std::fs::read(&link).unwrap(), bytes, "{file}");
        assert_eq!(
            &std::fs::read(repo.join("blobs").join(&etag)).unwrap(),
            bytes,
            "{file}"
        );
        expected_blobs.push(format!("blobs/{etag}"));
    }
    let listed: Vec<String> = files_under(&repo)
        .into_iter()
        .filter(|f| f.starts_with("blobs/"))
        .collect();
    expected_blobs.sort();
    assert_eq!(listed, expected_blobs, "nothing but finished blobs");
    assert!(
        repo.join(".no_exist")
            .join(COMMIT)
            .join("special_tokens_map.json")
            .is_file(),
        "a 404 on an optional file is recorded as huggingface_hub records it"
    );
}

fn maporl(hf_home: &Path, envs: &[(&str, &str)], args: &[&str]) -> Output {
    command(hf_home, envs, args)
        .output()
        .expect("running maporl")
}

/// The maporl command [`maporl`] runs.
fn command(hf_home: &Path, envs: &[(&str, &str)], args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_maporl"));
    cmd.args(args)
        .env("HF_HOME", hf_home)
        .env("MAPORL_CACHE_DIR", hf_home.join("maporl-cache"))
        .env_remove("MAPORL_PLUGINS");
    for var in [
        "HF_HUB_CACHE",
        "HF_TOKEN",
        "HF_TOKEN_PATH",
        "HF_HUB_OFFLINE",
        "HF_ENDPOINT",
        "XDG_CACHE_HOME",
        "MAPORL_HTTP_TIMEOUT",
        "MAPORL_HTTP_MIN_RATE",
        "MAPORL_HUB_MAX_FILE_BYTES",
    ] {
        cmd.env_remove(var);
    }
    for (k, v) in envs {
        cmd.env(k, v);
    }
    cmd
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// `maporl debate` on `model_path`, two agents, two turns, a few tokens each.
fn debate(hf_home: &Path, envs: &[(&str, &str)], model_path: &str) -> Output {
    debate_command(hf_home, envs, model_path)
        .output()
        .expect("running maporl")
}

/// The command [`debate`] runs.
fn debate_command(hf_home: &Path, envs: &[(&str, &str)], model_path: &str) -> Command {
    let config = repo().join("configs/smollm2-arith.toml");
    let mut args = vec![
        "debate".to_string(),
        "--config".into(),
        config.to_string_lossy().into_owned(),
        "--question".into(),
        "What is 2 + 3?".into(),
        "--reference".into(),
        "5".into(),
    ];
    for set in [
        format!("model.path={model_path}"),
        "debate.turns=2".into(),
        "generation.max_new_tokens=4".into(),
        "plugins.shaper.path=final-only".into(),
        "plugins.shaper.settings={}".into(),
        "plugins.verifier.path=exact_match.wasm".into(),
        "plugins.verifier.settings={}".into(),
    ] {
        args.push("--set".into());
        args.push(set);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    command(hf_home, envs, &args)
}

#[test]
fn a_hub_model_downloads_into_the_hf_cache_layout_runs_and_is_then_used_offline() {
    let server = Server::tiny(Quirks::default());
    let dir = tempfile::tempdir().unwrap();
    let hf_home = dir.path().join("hf-home");
    let model_path = format!("hf:{ORG}/{NAME}");
    let out = debate(&hf_home, &[("HF_ENDPOINT", &server.base_url)], &model_path);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("turn 2"), "{}", text(&out));
    assert!(text(&out).contains("Agent 2 (answer"), "{}", text(&out));

    let cache = hf_home.join("hub");
    assert_layout(&cache, NAME, tiny_files());
    let requests = server.requests();
    // The weights came from the CDN the hub redirected to.
    let weights_sha = sha256(&tiny_files()["model.safetensors"]);
    assert!(
        requests
            .iter()
            .any(|r| r.method == "GET" && r.path == format!("/cdn/{weights_sha}")),
        "{requests:?}"
    );
    // The first file pinned the commit; the rest were asked for at it.
    assert_eq!(
        requests[0].path,
        format!("/{ORG}/{NAME}/resolve/main/config.json")
    );
    assert!(
        requests[1..]
            .iter()
            .filter(|r| r.path.contains("/resolve/"))
            .all(|r| r.path.contains(&format!("/resolve/{COMMIT}/"))),
        "{requests:?}"
    );
    assert!(requests.iter().all(|r| r.authorization.is_none()));

    // The library sees the same snapshot, and loads it, with no request at all.
    let before = server.requests().len();
    let snapshot = hub(&server, &cache).snapshot(&model(NAME)).unwrap();
    assert_eq!(
        snapshot,
        cache
            .join(format!("models--{ORG}--{NAME}/snapshots"))
            .join(COMMIT)
    );
    let loaded = maporl::model::load(
        &snapshot,
        candle_core::DType::F32,
        &candle_core::Device::Cpu,
    )
    .unwrap();
    assert!(loaded.tokenizer.is_some() && loaded.chat_template.is_some());
    // A second run (and the pinned commit) make no request either, offline or not.
    let out = debate(
        &hf_home,
        &[("HF_ENDPOINT", &server.base_url)],
        &format!("{model_path}@{COMMIT}"),
    );
    assert!(out.status.success(), "{}", text(&out));
    let out = debate(
        &hf_home,
        &[
            ("HF_ENDPOINT", "http://127.0.0.1:9"),
            ("HF_HUB_OFFLINE", "1"),
        ],
        &model_path,
    );
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(server.requests().len(), before, "{:?}", server.requests());
}

#[test]
fn sharded_weights_come_with_their_index() {
    let files = sharded_files();
    let server = Server::start(
        BTreeMap::from([(SHARDED.to_string(), files.clone())]),
        Quirks::default(),
    );
    let dir = tempfile::tempdir().unwrap();
    let snapshot = hub(&server, dir.path()).snapshot(&model(SHARDED)).unwrap();
    assert_layout(dir.path(), SHARDED, &files);
    let repo = dir.path().join(format!("models--{ORG}--{SHARDED}"));
    assert!(repo
        .join(".no_exist")
        .join(COMMIT)
        .join("model.safetensors")
        .is_file());
    assert!(!snapshot.join("model.safetensors").exists());
    maporl::model::load(
        &snapshot,
        candle_core::DType::F32,
        &candle_core::Device::Cpu,
    )
    .unwrap();
    let before = server.requests().len();
    hub(&server, dir.path()).snapshot(&model(SHARDED)).unwrap();
    assert_eq!(server.requests().len(), before);

    // A shard name that climbs out of the snapshot is refused before anything is fetched.
    let server = Server::start(
        BTreeMap::from([(SHARDED.to_string(), files)]),
        Quirks {
            shard_name: Some("../../../escaped.safetensors".into()),
            ..Quirks::default()
        },
    );
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("hub");
    let e = format!(
        "{:#}",
        hub(&server, &cache).snapshot(&model(SHARDED)).unwrap_err()
    );
    assert!(
        e.contains("../../../escaped.safetensors") && e.contains("refused"),
        "{e}"
    );
    assert!(!server.requests().iter().any(|r| r.path.contains("escaped")));
    assert!(files_under(dir.path())
        .iter()
        .all(|f| !f.contains("escaped") && !f.contains("snapshots")));
}

#[test]
fn an_interrupted_download_resumes_with_a_range_request() {
    let weights = &tiny_files()["model.safetensors"];
    let sha = sha256(weights);
    for ignore_range in [false, true] {
        let server = Server::tiny(Quirks {
            ignore_range,
            ..Quirks::default()
        });
        let dir = tempfile::tempdir().unwrap();
        let blobs = dir.path().join(format!("models--{ORG}--{NAME}/blobs"));
        std::fs::create_dir_all(&blobs).unwrap();
        let half = weights.len() / 2;
        std::fs::write(blobs.join(format!("{sha}.incomplete")), &weights[..half]).unwrap();
        hub(&server, dir.path()).snapshot(&model(NAME)).unwrap();
        let cdn: Vec<Request> = server
            .requests()
            .into_iter()
            .filter(|r| r.path.starts_with("/cdn/"))
            .collect();
        assert_eq!(cdn.len(), 1, "{cdn:?}");
        assert_eq!(
            cdn[0].range.as_deref(),
            Some(format!("bytes={half}-").as_str())
        );
        // Whether the server honoured the range (206) or sent it all again (200), the
        // blob is the file.
        assert_layout(dir.path(), NAME, tiny_files());
        assert!(!blobs.join(format!("{sha}.incomplete")).exists());
    }
}

#[test]
fn a_corrupted_lfs_file_is_refused_naming_both_hashes() {
    let server = Server::tiny(Quirks {
        corrupt: true,
        ..Quirks::default()
    });
    let dir = tempfile::tempdir().unwrap();
    let weights = &tiny_files()["model.safetensors"];
    let expected = sha256(weights);
    let mut bad = weights.clone();
    for b in bad.iter_mut().step_by(97) {
        *b ^= 0x5a;
    }
    let actual = sha256(&bad);
    let e = format!(
        "{:#}",
        hub(&server, dir.path()).snapshot(&model(NAME)).unwrap_err()
    );
    assert!(
        e.contains("sha256 mismatch for model.safetensors")
            && e.contains(&expected)
            && e.contains(&actual),
        "{e}"
    );
    let repo = dir.path().join(format!("models--{ORG}--{NAME}"));
    assert!(!repo.join("snapshots").exists(), "{:?}", files_under(&repo));
    assert!(!repo.join("refs").exists());
    assert!(files_under(&repo)
        .iter()
        .all(|f| !f.contains(&expected) && !f.ends_with(".incomplete")));
}

#[test]
fn hf_token_goes_to_the_hub_as_a_bearer_header() {
    let server = Server::tiny(Quirks::default());
    let dir = tempfile::tempdir().unwrap();
    let hf_home = dir.path().join("hf-home");
    // A debate run would do, but an unknown revision stops right after the first request.
    let out = debate(
        &hf_home,
        &[
            ("HF_ENDPOINT", &server.base_url),
            ("HF_TOKEN", "hf_secret123"),
        ],
        &format!("hf:{ORG}/{NAME}@nope"),
    );
    assert!(!out.status.success());
    assert!(text(&out).contains("RevisionNotFound"), "{}", text(&out));
    let requests = server.requests();
    assert_eq!(requests.len(), 1, "{requests:?}");
    assert_eq!(
        requests[0].authorization.as_deref(),
        Some("Bearer hf_secret123")
    );

    // Without HF_TOKEN, the token file in HF_HOME; on every request to the hub.
    std::fs::create_dir_all(&hf_home).unwrap();
    std::fs::write(hf_home.join("token"), "hf_fromfile\n").unwrap();
    let hub =
        Hub::from_vars(|k| (k == "HF_HOME").then(|| hf_home.to_string_lossy().into())).unwrap();
    assert_eq!(hub.token.as_deref(), Some("hf_fromfile"));
    let hub = Hub {
        endpoint: server.base_url.clone(),
        ..hub
    };
    hub.snapshot(&model(NAME)).unwrap();
    let requests = server.requests();
    assert!(requests.len() > 5);
    assert!(
        requests[1..]
            .iter()
            .all(|r| r.authorization.as_deref() == Some("Bearer hf_fromfile")),
        "{requests:?}"
    );

    // A repository the hub does not show without a token says so.
    let e = format!(
        "{:#}",
        hub_at(&server.base_url, &dir.path().join("other"))
            .snapshot(&model("private-one"))
            .unwrap_err()
    );
    assert!(e.contains("HTTP 401") && e.contains("HF_TOKEN"), "{e}");
}

#[test]
fn bad_names_are_refused_clearly() {
    let dir = tempfile::tempdir().unwrap();
    for (path, says) in [
        ("hf:../x", "the organization \"..\""),
        ("hf:a/b/c", "only one `/`"),
        ("hf:org/", "the name is empty"),
        ("hf:org/x@", "the revision is empty"),
        ("hf:org/x@a/b", "the revision \"a/b\" has the character '/'"),
    ] {
        // The binary, before any request (HF_ENDPOINT points nowhere).
        let out = debate(dir.path(), &[("HF_ENDPOINT", "http://127.0.0.1:9")], path);
        assert!(!out.status.success(), "{path}");
        let t = text(&out);
        assert!(t.contains(says) && t.contains("hf:ORG/NAME"), "{path}: {t}");
        assert!(!dir.path().join("hub").exists());
    }
    // warm-start writes its model to model.path, so a hub name is refused there.
    let out = maporl(
        dir.path(),
        &[],
        &[
            "warm-start",
            "--config",
            repo().join("configs/smollm2-arith.toml").to_str().unwrap(),
            "--set",
            "model.path=hf:org/name",
        ],
    );
    assert!(!out.status.success());
    assert!(
        text(&out).contains("names a hub model") && text(&out).contains("local folder"),
        "{}",
        text(&out)
    );
}

#[test]
fn offline_with_an_empty_cache_says_what_is_missing() {
    let dir = tempfile::tempdir().unwrap();
    let out = debate(
        dir.path(),
        &[
            ("HF_HUB_OFFLINE", "1"),
            ("HF_ENDPOINT", "http://127.0.0.1:9"),
        ],
        &format!("hf:{ORG}/{NAME}"),
    );
    assert!(!out.status.success());
    let t = text(&out);
    assert!(
        t.contains("HF_HUB_OFFLINE is set")
            && t.contains(&format!("hf:{ORG}/{NAME}@main is not in the cache"))
            && t.contains("refs/main"),
        "{t}"
    );
}

#[test]
fn hostile_headers_and_bodies_are_refused() {
    let weights = &tiny_files()["model.safetensors"];
    for (quirks, says) in [
        (
            Quirks {
                etag: Some("\"../../../../evil\"".into()),
                ..Quirks::default()
            },
            "refusing the ETag \"\\\"../../../../evil\\\"\" for config.json",
        ),
        (
            Quirks {
                etag: Some("\"a/b\"".into()),
                ..Quirks::default()
            },
            "refusing the ETag",
        ),
        (
            // 200 + `.incomplete` would pass the 255-byte limit on a file name.
            Quirks {
                etag: Some(format!("\"{}\"", "a".repeat(200))),
                ..Quirks::default()
            },
            "refusing the ETag for config.json: it is 200 characters long, over the limit of 128",
        ),
        (
            Quirks {
                linked_size: Some(100 << 30),
                ..Quirks::default()
            },
            "over the limit",
        ),
        (
            Quirks {
                extra_bytes: 1000,
                ..Quirks::default()
            },
            "more than the",
        ),
        (
            Quirks {
                linked_size: Some(weights.len() as u64 - 10),
                ..Quirks::default()
            },
            "refused",
        ),
    ] {
        let server = Server::tiny(quirks);
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().join("cache").join("hub");
        let e = format!(
            "{:#}",
            hub(&server, &cache).snapshot(&model(NAME)).unwrap_err()
        );
        assert!(e.contains(says), "{says}: {e}");
        // Nothing outside the cache, no snapshot, no half-written blob left.
        let all = files_under(dir.path());
        assert!(
            all.iter().all(|f| f.starts_with("cache/hub/")
                && !f.contains("evil")
                && !f.contains("snapshots")
                && !f.ends_with(".incomplete")),
            "{says}: {all:?}"
        );
    }
}

/// A shared or group-writable cache may hold links someone planted: the download replaces
/// or refuses them, and never writes through one.
#[test]
#[cfg(unix)]
fn planted_symlinks_in_the_cache_are_never_written_through() {
    use std::os::unix::fs::symlink;
    let server = Server::tiny(Quirks::default());
    let dir = tempfile::tempdir().unwrap();
    let folder = format!("models--{ORG}--{NAME}");
    let victim = dir.path().join("victim.txt");
    std::fs::write(&victim, "precious").unwrap();

    // blobs/<etag>.incomplete -> a file elsewhere: the link is replaced, the file untouched.
    let cache = dir.path().join("hub1");
    let blobs = cache.join(&folder).join("blobs");
    std::fs::create_dir_all(&blobs).unwrap();
    let sha = sha256(&tiny_files()["model.safetensors"]);
    let config_etag = etag_of("config.json", &tiny_files()["config.json"]);
    for etag in [&sha, &config_etag] {
        symlink(&victim, blobs.join(format!("{etag}.incomplete"))).unwrap();
    }
    hub(&server, &cache).snapshot(&model(NAME)).unwrap();
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
    assert_layout(&cache, NAME, tiny_files());

    // snapshots/<commit> -> a folder elsewhere holding files of the same names: refused,
    // naming the link; the folder's files keep their bytes.
    let cache = dir.path().join("hub2");
    let victim_dir = dir.path().join("victim-dir");
    std::fs::create_dir_all(&victim_dir).unwrap();
    for file in ["config.json", "model.safetensors", "notes.txt"] {
        std::fs::write(victim_dir.join(file), format!("keep {file}")).unwrap();
    }
    let snapshots = cache.join(&folder).join("snapshots");
    std::fs::create_dir_all(&snapshots).unwrap();
    symlink(&victim_dir, snapshots.join(COMMIT)).unwrap();
    let e = format!(
        "{:#}",
        hub(&server, &cache).snapshot(&model(NAME)).unwrap_err()
    );
    assert!(
        e.contains(&snapshots.join(COMMIT).display().to_string()) && e.contains("symbolic link"),
        "{e}"
    );
    assert_eq!(
        files_under(&victim_dir),
        ["config.json", "model.safetensors", "notes.txt"]
    );
    for file in ["config.json", "model.safetensors", "notes.txt"] {
        assert_eq!(
            std::fs::read_to_string(victim_dir.join(file)).unwrap(),
            format!("keep {file}")
        );
    }
    assert!(!cache.join(&folder).join("refs").exists());

    // A lock file planted as a link: refused, naming it; its target is not created.
    let cache = dir.path().join("hub3");
    let locks = cache.join(".locks").join(&folder);
    std::fs::create_dir_all(&locks).unwrap();
    let lock = locks.join(format!("{config_etag}.lock"));
    symlink(dir.path().join("made-by-lock"), &lock).unwrap();
    let e = format!(
        "{:#}",
        hub(&server, &cache).snapshot(&model(NAME)).unwrap_err()
    );
    assert!(
        e.contains(&lock.display().to_string()) && e.contains("symbolic link"),
        "{e}"
    );
    assert!(!dir.path().join("made-by-lock").exists());
}

// A hostile hub and CDN on loopback (support::hostile, a thread per connection): what they
// say reaches messages escaped and cut short, a model file over its announced size or the
// maximum is refused leaving nothing, a download streams in bounded memory, and a server
// that trickles is cut off at the whole-request deadline.

use support::hostile::{self, Answer, HOSTILE_TEXT};

/// A hub serving the tiny model at COMMIT as the real one does, but for `model.safetensors`:
/// its HEAD is a redirect to `/cdn/weights` announcing the ETag `sha256(weights)` and the
/// size `size` (none: no size at all), and `/cdn/weights` answers `cdn`. `config_head`, when
/// given, answers the HEAD of config.json (the first request of a download).
fn hostile_hub(
    weights: &[u8],
    size: Option<u64>,
    config_head: Option<Answer>,
    cdn: Answer,
) -> hostile::Server {
    let etag = sha256(weights);
    let files = tiny_files().clone();
    hostile::Server::start(move |r| {
        let path = r.path().to_string();
        if path == "/cdn/weights" {
            return cdn.clone();
        }
        let parts: Vec<&str> = path.trim_start_matches('/').splitn(5, '/').collect();
        let [_, _, "resolve", _, file] = parts.as_slice() else {
            return Answer::new(404, "");
        };
        if let (Some(answer), "config.json", "HEAD") = (&config_head, *file, r.method.as_str()) {
            return answer.clone();
        }
        if *file == "model.safetensors" {
            let host = r.header("host").unwrap_or("");
            let mut a = Answer::new(302, "")
                .header("X-Repo-Commit", COMMIT)
                .header("Location", format!("http://{host}/cdn/weights"))
                .header("X-Linked-Etag", format!("\"{etag}\""))
                .unframed();
            if let Some(size) = size {
                a = a.header("X-Linked-Size", size.to_string());
            }
            return a;
        }
        match files.get(*file) {
            Some(bytes) => Answer::new(200, bytes.clone())
                .header("X-Repo-Commit", COMMIT)
                .header("ETag", format!("\"{}\"", etag_of(file, bytes))),
            None => Answer::new(404, "")
                .header("X-Repo-Commit", COMMIT)
                .header("X-Error-Code", "EntryNotFound"),
        }
    })
}

fn hostile_hub_at(server: &hostile::Server, cache: &Path, max: u64, deadline_s: u64) -> Hub {
    Hub {
        max_file_bytes: max,
        deadline: maporl::net::Deadline {
            base: Duration::from_secs(deadline_s),
            min_rate: 1_000_000_000,
        },
        ..hub_at(&server.url(), cache)
    }
}

/// Nothing of `weights` is in the cache: no blob, no partial download, no snapshot (the
/// lock files in `.locks/` stay, as `huggingface_hub`'s do).
fn assert_no_weights(cache: &Path, weights: &[u8], what: &str) {
    let all = files_under(cache);
    let sha = sha256(weights);
    assert!(
        all.iter().filter(|f| !f.starts_with(".locks/")).all(|f| {
            !f.contains(&sha) && !f.ends_with(".incomplete") && !f.contains("snapshots")
        }),
        "{what}: {all:?}"
    );
}

fn cdn_requests(server: &hostile::Server) -> usize {
    server
        .requests()
        .iter()
        .filter(|(_, t)| t.starts_with("/cdn/"))
        .count()
}

#[test]
fn a_hostile_hubs_words_reach_messages_escaped_and_cut_short() {
    let weights = tiny_files()["model.safetensors"].clone();
    let n = weights.len() as u64;
    let long = "A".repeat(20_000);
    let megabyte: Vec<u8> = HOSTILE_TEXT
        .as_bytes()
        .iter()
        .copied()
        .cycle()
        .take(1 << 20)
        .collect();
    // (what, the hub, what the error must say, whether the server's text shows, escaped)
    let cases: Vec<(&str, hostile::Server, &str, bool)> = vec![
        (
            "a CDN's error body",
            hostile_hub(
                &weights,
                Some(n),
                None,
                Answer::new(403, hostile::hostile_body(100_000)),
            ),
            "HTTP 403",
            true,
        ),
        (
            "a megabyte error body, unframed",
            hostile_hub(
                &weights,
                Some(n),
                None,
                Answer::new(500, megabyte.clone()).unframed(),
            ),
            "HTTP 500",
            true,
        ),
        (
            "the hub's error headers",
            hostile_hub(
                &weights,
                Some(n),
                Some(
                    Answer::new(401, "")
                        .header("X-Error-Code", format!("Hostile{long}"))
                        .header("X-Error-Message", long.clone()),
                ),
                Answer::new(404, ""),
            ),
            "HTTP 401",
            false,
        ),
        (
            "an X-Repo-Commit",
            hostile_hub(
                &weights,
                Some(n),
                Some(
                    Answer::new(200, "")
                        .header("X-Repo-Commit", format!("zz{long}"))
                        .header("ETag", "\"abc\""),
                ),
                Answer::new(404, ""),
            ),
            "refusing X-Repo-Commit",
            false,
        ),
        (
            "a size",
            hostile_hub(
                &weights,
                Some(n),
                Some(
                    Answer::new(200, "")
                        .header("X-Repo-Commit", COMMIT)
                        .header("ETag", "\"abc\"")
                        .header("X-Linked-Size", format!("1{long}")),
                ),
                Answer::new(404, ""),
            ),
            "not a number",
            false,
        ),
    ];
    for (what, server, says, shown) in cases {
        let dir = tempfile::tempdir().unwrap();
        let e = format!(
            "{:#}",
            hostile_hub_at(&server, &dir.path().join("hub"), 1 << 30, 120)
                .snapshot(&model(NAME))
                .unwrap_err()
        );
        eprintln!("--- {what}: {e}");
        assert!(e.contains(says), "{what}: no {says:?} in:\n{e}");
        hostile::assert_terminal_safe(&e, 2000);
        assert!(!e.contains('\n'), "{what}: {e}");
        if shown {
            assert!(e.contains("\\u{1b}"), "{what}: {e}");
        }
        assert!(!e.contains(&"A".repeat(400)), "{what}: not cut short: {e}");
        assert_no_weights(&dir.path().join("hub"), &weights, what);
    }
    // What reaches the terminal from `maporl`, too.
    let server = hostile_hub(
        &weights,
        Some(n),
        None,
        Answer::new(403, hostile::hostile_body(100_000)),
    );
    let dir = tempfile::tempdir().unwrap();
    let out = debate(
        dir.path(),
        &[("HF_ENDPOINT", &server.url())],
        &format!("hf:{ORG}/{NAME}"),
    );
    let out = text(&out);
    assert!(out.contains("HTTP 403") && out.contains("\\u{1b}"), "{out}");
    hostile::assert_terminal_safe(&out, 8000);
}

#[test]
fn model_files_over_their_announced_size_or_the_maximum_are_refused_leaving_nothing() {
    let weights = tiny_files()["model.safetensors"].clone();
    let n = weights.len() as u64;
    // The other files are smaller: the weights are the ones over it.
    const MAX: u64 = 2_000_000;
    assert!(n > MAX);
    assert!(
        tiny_files()
            .values()
            .filter(|b| b.len() as u64 > MAX)
            .count()
            == 1
    );
    let ten_mib = vec![7u8; 10 << 20];
    let longer = [&weights[..], &vec![7u8; 1 << 20]].concat();
    // (what, the hub, the maximum, what the error must say, whether the CDN may be asked)
    let cases: Vec<(&str, hostile::Server, u64, &str, bool)> = vec![
        (
            "announced over the maximum",
            hostile_hub(&weights, Some(n), None, Answer::new(200, weights.clone())),
            MAX,
            "over the limit of 2000000 bytes",
            false,
        ),
        (
            "no size announced, over the maximum, unframed",
            hostile_hub(
                &weights,
                None,
                None,
                Answer::new(200, weights.clone()).unframed(),
            ),
            MAX,
            "over the limit of 2000000 bytes",
            true,
        ),
        (
            "no size announced, Content-Length over the maximum",
            hostile_hub(&weights, None, None, Answer::new(200, weights.clone())),
            MAX,
            "refused before writing",
            true,
        ),
        (
            "a Content-Length other than the announced size",
            hostile_hub(&weights, Some(n), None, Answer::new(200, ten_mib.clone())),
            1 << 30,
            "refused before writing",
            true,
        ),
        (
            "more than the announced size, unframed",
            hostile_hub(
                &weights,
                Some(n),
                None,
                Answer::new(200, longer.clone()).unframed(),
            ),
            1 << 30,
            "cut there and refused",
            true,
        ),
    ];
    for (what, server, max, says, cdn) in cases {
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().join("hub");
        let e = format!(
            "{:#}",
            hostile_hub_at(&server, &cache, max, 120)
                .snapshot(&model(NAME))
                .unwrap_err()
        );
        eprintln!("--- {what}: {e}");
        assert!(e.contains(says), "{what}: no {says:?} in:\n{e}");
        assert!(e.contains("model.safetensors"), "{what}: {e}");
        if !cdn {
            assert_eq!(
                cdn_requests(&server),
                0,
                "{what}: downloaded before refusing"
            );
        }
        assert_no_weights(&cache, &weights, what);
    }
}

#[test]
#[cfg(target_os = "linux")]
fn a_large_model_file_streams_to_disk_in_bounded_memory() {
    let mut peak = Vec::new();
    for size in [1024usize, 48 << 20] {
        let weights: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
        // Another file of the same size: the sha256 check fails once it is all in.
        let sent: Vec<u8> = weights.iter().map(|b| b ^ 0x5a).collect();
        let server = hostile_hub(&weights, Some(size as u64), None, Answer::new(200, sent));
        let dir = tempfile::tempdir().unwrap();
        let (out, bytes) = hostile::output_and_peak_memory(&mut debate_command(
            dir.path(),
            &[("HF_ENDPOINT", &server.url())],
            &format!("hf:{ORG}/{NAME}"),
        ));
        let text = text(&out);
        assert!(!out.status.success(), "{text}");
        assert!(
            text.contains("sha256 mismatch for model.safetensors"),
            "{text}"
        );
        assert_eq!(cdn_requests(&server), 1);
        assert_no_weights(&dir.path().join("hub"), &weights, "a large file");
        peak.push(bytes);
    }
    eprintln!(
        "peak resident memory of a hub download: {} MiB with a 1 KiB file, {} MiB with a \
         48 MiB one",
        peak[0] >> 20,
        peak[1] >> 20
    );
    assert!(
        peak[1] < peak[0] + (16 << 20),
        "a 48 MiB file raised the peak memory from {} to {} MiB: it was not streamed",
        peak[0] >> 20,
        peak[1] >> 20
    );
}

#[test]
fn a_trickling_hub_is_cut_off_at_the_whole_request_deadline() {
    use std::time::Instant;
    let weights = tiny_files()["model.safetensors"].clone();
    let n = weights.len() as u64;
    let gap = Duration::from_millis(100);
    let cases: Vec<(&str, hostile::Server, bool)> = vec![
        (
            "a HEAD answer",
            hostile_hub(
                &weights,
                Some(n),
                Some(
                    Answer::new(200, "")
                        .header("X-Repo-Commit", COMMIT)
                        .header("ETag", "\"abc\"")
                        .trickle_all(gap),
                ),
                Answer::new(404, ""),
            ),
            false,
        ),
        (
            "the CDN's body",
            hostile_hub(
                &weights,
                Some(n),
                None,
                Answer::new(200, weights.clone()).trickle_body(gap),
            ),
            true,
        ),
        (
            "the CDN's status line",
            hostile_hub(
                &weights,
                Some(n),
                None,
                Answer::new(200, weights.clone()).trickle_all(gap),
            ),
            false,
        ),
    ];
    for (what, server, resumable) in cases {
        let dir = tempfile::tempdir().unwrap();
        let started = Instant::now();
        let e = format!(
            "{:#}",
            hostile_hub_at(&server, &dir.path().join("hub"), 1 << 30, 2)
                .snapshot(&model(NAME))
                .unwrap_err()
        );
        eprintln!("--- {what}: {e}");
        let took = started.elapsed();
        assert!(
            e.contains("deadline of 2.") && e.contains("MAPORL_HTTP_TIMEOUT=2"),
            "{what}: {e}"
        );
        if resumable {
            assert!(e.contains("run again to resume"), "{what}: {e}");
        }
        // Generous for a loaded machine, far below the minute a trickle lasts.
        assert!(took < Duration::from_secs(20), "{what}: took {took:?}: {e}");
    }
}
