//! TensorBoard event files: every training command writes its metrics as scalars into
//! `RUN/tensorboard/` beside `metrics.jsonl` (`tensorboard --logdir runs/`).
//!
//! The format, written here without TensorFlow: an event file is a sequence of TFRecords
//! (`u64` length, its masked CRC-32C, the bytes, their masked CRC-32C, little-endian), each
//! an `Event` protocol buffer: `wall_time` (1, double), `step` (2, int64), and one of
//! `file_version` (3, "brain.Event:2", the first record), `summary` (5: repeated `value` (1)
//! of `tag` (1, string) and `simple_value` (2, float)) or `session_log` (6: `status` (1),
//! START = 1).
//!
//! Each process writes a file of its own. A resumed run starts its file with a
//! `SessionLog.START` at the first step it will redo, so TensorBoard drops what the killed
//! process logged from that step on, as `metrics.jsonl` is truncated to the checkpoint.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;

/// The run directory's subdirectory for event files.
pub const DIR: &str = "tensorboard";

/// Appends events to a new event file.
pub struct EventWriter {
    file: std::fs::File,
    path: PathBuf,
}

impl EventWriter {
    /// Creates `run_dir/tensorboard/events.out.tfevents.<secs>.maporl.<pid>`. With
    /// `resume_at`, the first step this process will log after resuming: TensorBoard then
    /// discards any events an earlier process logged for that step and later ones.
    pub fn create(run_dir: &Path, resume_at: Option<i64>) -> anyhow::Result<EventWriter> {
        let dir = run_dir.join(DIR);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let secs = wall_time() as u64;
        let mut n = 0;
        let path = loop {
            let name = format!(
                "events.out.tfevents.{secs:010}.maporl.{}{}",
                std::process::id(),
                if n == 0 {
                    String::new()
                } else {
                    format!(".{n}")
                }
            );
            let path = dir.join(name);
            if !path.exists() {
                break path;
            }
            n += 1;
        };
        let file = std::fs::OpenOptions::new()
            .create_new(true)
            .append(true)
            .open(&path)
            .with_context(|| format!("creating {}", path.display()))?;
        let mut writer = EventWriter { file, path };
        let mut version = event(0);
        field_bytes(&mut version, 3, b"brain.Event:2");
        writer.record(&version)?;
        if let Some(step) = resume_at {
            let mut start = event(step);
            let mut log = Vec::new();
            field_varint(&mut log, 1, 1); // SessionLog.status = START
            field_bytes(&mut start, 6, &log);
            writer.record(&start)?;
        }
        Ok(writer)
    }

    /// Writes one event with every `(tag, value)` as a scalar at `step`; non-finite values
    /// are written as they are (TensorBoard shows them as gaps).
    pub fn scalars(&mut self, step: i64, values: &[(String, f32)]) -> anyhow::Result<()> {
        if values.is_empty() {
            return Ok(());
        }
        let mut summary = Vec::new();
        for (tag, value) in values {
            let mut v = Vec::new();
            field_bytes(&mut v, 1, tag.as_bytes());
            v.push(2 << 3 | 5); // simple_value: field 2, 32-bit
            v.extend_from_slice(&value.to_le_bytes());
            field_bytes(&mut summary, 1, &v);
        }
        let mut e = event(step);
        field_bytes(&mut e, 5, &summary);
        self.record(&e)
    }

    /// The file being written.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn record(&mut self, data: &[u8]) -> anyhow::Result<()> {
        let len = (data.len() as u64).to_le_bytes();
        let mut out = Vec::with_capacity(data.len() + 16);
        out.extend_from_slice(&len);
        out.extend_from_slice(&masked_crc(&len).to_le_bytes());
        out.extend_from_slice(data);
        out.extend_from_slice(&masked_crc(data).to_le_bytes());
        self.file
            .write_all(&out)
            .and_then(|()| self.file.flush())
            .with_context(|| format!("writing {}", self.path.display()))
    }
}

/// The scalars of one metrics line: every number in it, tagged by its path with `/`
/// (`agents/0/kl`, `reward_parts/influence`, `accuracy/2` for the second element of an
/// array), after `prefix/` when `prefix` is not empty, sorted by tag; top-level keys in
/// `skip` are left out.
pub fn scalars_of(line: &serde_json::Value, prefix: &str, skip: &[&str]) -> Vec<(String, f32)> {
    fn walk(v: &serde_json::Value, tag: String, out: &mut Vec<(String, f32)>) {
        match v {
            serde_json::Value::Number(n) => {
                if let Some(x) = n.as_f64() {
                    out.push((tag, x as f32));
                }
            }
            serde_json::Value::Bool(b) => out.push((tag, f32::from(u8::from(*b)))),
            serde_json::Value::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    walk(item, format!("{tag}/{}", i + 1), out);
                }
            }
            serde_json::Value::Object(map) => {
                for (k, item) in map {
                    walk(item, format!("{tag}/{k}"), out);
                }
            }
            serde_json::Value::Null | serde_json::Value::String(_) => {}
        }
    }
    let mut out = Vec::new();
    if let serde_json::Value::Object(map) = line {
        for (k, v) in map {
            if skip.contains(&k.as_str()) {
                continue;
            }
            let tag = if prefix.is_empty() {
                k.clone()
            } else {
                format!("{prefix}/{k}")
            };
            walk(v, tag, &mut out);
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

fn wall_time() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// An `Event` with `wall_time` (now) and `step`.
fn event(step: i64) -> Vec<u8> {
    let mut e = vec![1 << 3 | 1]; // wall_time: field 1, 64-bit
    e.extend_from_slice(&wall_time().to_le_bytes());
    field_varint(&mut e, 2, step as u64);
    e
}

fn varint(out: &mut Vec<u8>, mut x: u64) {
    while x >= 0x80 {
        out.push((x as u8) | 0x80);
        x >>= 7;
    }
    out.push(x as u8);
}

fn field_varint(out: &mut Vec<u8>, field: u64, x: u64) {
    varint(out, field << 3);
    varint(out, x);
}

fn field_bytes(out: &mut Vec<u8>, field: u64, bytes: &[u8]) {
    varint(out, field << 3 | 2);
    varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

/// CRC-32C (Castagnoli), masked as TFRecords store it.
fn masked_crc(data: &[u8]) -> u32 {
    static TABLE: std::sync::OnceLock<[u32; 256]> = std::sync::OnceLock::new();
    let table = TABLE.get_or_init(|| {
        let mut t = [0u32; 256];
        for (i, slot) in t.iter_mut().enumerate() {
            let mut c = i as u32;
            for _ in 0..8 {
                c = if c & 1 != 0 {
                    0x82f6_3b78 ^ (c >> 1)
                } else {
                    c >> 1
                };
            }
            *slot = c;
        }
        t
    });
    let mut crc = !0u32;
    for &b in data {
        crc = table[((crc ^ u32::from(b)) & 0xff) as usize] ^ (crc >> 8);
    }
    let crc = !crc;
    (crc.rotate_right(15)).wrapping_add(0xa282_ead8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32c_matches_the_published_check_value() {
        // CRC-32C("123456789") = 0xE3069283 (RFC 3720); masked as TFRecord does.
        let crc: u32 = 0xe306_9283;
        assert_eq!(
            masked_crc(b"123456789"),
            crc.rotate_right(15).wrapping_add(0xa282_ead8)
        );
    }

    #[test]
    fn metrics_flatten_to_tagged_scalars() {
        let line = serde_json::json!({
            "step": 3, "learning_rate": 0.5, "accuracy": [0.25, 0.75],
            "agents": {"0": {"kl": 0.1}, "1": {"kl": 0.2}},
            "reward_parts": {"influence": 0.4}, "note": "text", "missing": null
        });
        let got = scalars_of(&line, "", &["step"]);
        let want: Vec<(String, f32)> = vec![
            ("accuracy/1".into(), 0.25),
            ("accuracy/2".into(), 0.75),
            ("agents/0/kl".into(), 0.1),
            ("agents/1/kl".into(), 0.2),
            ("learning_rate".into(), 0.5),
            ("reward_parts/influence".into(), 0.4),
        ];
        assert_eq!(got, want);
        let prefixed = scalars_of(&serde_json::json!({"loss": 1.5}), "agent_1", &[]);
        assert_eq!(prefixed, vec![("agent_1/loss".to_string(), 1.5)]);
    }
}
