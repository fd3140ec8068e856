//! Patches as developers send them: `git format-patch` files, single mails, or mboxes of a
//! series; quoted-printable bodies are decoded. Each patch is applied with `patch -p1 --fuzz=0`,
//! so a patch that does not apply exactly is refused rather than applied somewhere else.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

use serde::{Deserialize, Serialize};

use crate::store::{ImageError, sha256};

/// A file of patches as it was sent (a format-patch file, a mail, an mbox of a series): its name
/// and its text. What a module build takes, whether the file was read here or its text came over
/// the API.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PatchFile {
    /// Its file name (what the module's manifest and errors call it).
    pub name: String,
    /// Its text.
    pub text: String,
}

impl PatchFile {
    /// Reads the file at `path` (a patch's bytes that are not UTF-8 are replaced).
    pub fn read(path: &Path) -> Result<PatchFile, ImageError> {
        let bytes = crate::store::read(path)?;
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        Ok(PatchFile { name, text: String::from_utf8_lossy(&bytes).into_owned() })
    }

    /// Its patches.
    pub fn parse(&self) -> Result<Vec<Patch>, ImageError> {
        parse(&self.name, &self.text)
    }
}

/// One patch of a series.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Patch {
    /// The file it came from.
    pub file: String,
    /// Its subject line, without the `[PATCH n/m]` tag.
    pub subject: String,
    /// Its author.
    pub author: String,
    /// Its mail's `Message-ID` (without the angle brackets), when it came as a mail.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message_id: String,
    /// SHA-256 of the diff.
    pub sha256: String,
    /// The files it changes.
    pub files: Vec<String>,
    /// The diff itself.
    #[serde(skip)]
    pub diff: String,
}

/// The patches in one file (a format-patch file, a mail or an mbox with several).
pub fn parse(file: &str, text: &str) -> Result<Vec<Patch>, ImageError> {
    let mut messages: Vec<Vec<&str>> = Vec::new();
    for line in text.lines() {
        // mbox separators: "From <something> <date>" at the start of a line.
        if line.starts_with("From ") && !messages.last().is_some_and(|m| m.is_empty()) {
            messages.push(Vec::new());
            continue;
        }
        if messages.is_empty() {
            messages.push(Vec::new());
        }
        messages.last_mut().expect("pushed").push(line);
    }
    let patches: Vec<Patch> = messages.iter().filter_map(|m| message(file, m)).collect();
    if patches.is_empty() {
        return Err(ImageError::Invalid(format!("{file}: no patch in it (no `diff --git` or `---`/`+++` lines)")));
    }
    Ok(patches)
}

fn message(file: &str, lines: &[&str]) -> Option<Patch> {
    // Headers run to the first empty line, when the message has headers at all.
    let has_headers = lines.first().is_some_and(|l| l.contains(':') && !l.starts_with("diff "));
    let (headers, body) = if has_headers {
        let end = lines.iter().position(|l| l.is_empty()).unwrap_or(lines.len());
        (&lines[..end], &lines[(end + 1).min(lines.len())..])
    } else {
        (&lines[..0], lines)
    };
    let header = |name: &str| -> String {
        let mut value = String::new();
        let mut inside = false;
        for line in headers {
            // Header names are case-insensitive (RFC 5322): `Message-Id` is `Message-ID`.
            let named = line.split_once(':').filter(|(n, _)| n.eq_ignore_ascii_case(name));
            if let Some((_, rest)) = named {
                value = rest.trim().to_string();
                inside = true;
            } else if inside && line.starts_with([' ', '\t']) {
                value.push(' ');
                value.push_str(line.trim());
            } else {
                inside = false;
            }
        }
        value
    };
    let quoted_printable = header("Content-Transfer-Encoding").eq_ignore_ascii_case("quoted-printable");
    let body = if quoted_printable { decode_quoted_printable(&body.join("\n")) } else { body.join("\n") };
    let lines: Vec<&str> = body.lines().collect();
    let start = lines.iter().position(|l| l.starts_with("diff --git "))?;
    let end = lines[start..].iter().position(|l| *l == "-- " || *l == "--").map_or(lines.len(), |p| start + p);
    let mut diff = lines[start..end].join("\n");
    diff.push('\n');
    let files = lines[start..end].iter().filter_map(|l| l.strip_prefix("+++ b/")).map(String::from).collect();
    let subject = header("Subject");
    let subject = match subject.strip_prefix('[').and_then(|s| s.split_once(']')) {
        Some((_, rest)) => rest.trim().to_string(),
        None => subject,
    };
    Some(Patch {
        file: file.to_string(),
        subject,
        author: header("From"),
        message_id: header("Message-ID").trim_start_matches('<').trim_end_matches('>').to_string(),
        sha256: sha256(diff.as_bytes()),
        files,
        diff,
    })
}

/// Decodes quoted-printable text (soft line breaks `=` at a line's end, `=XX` escapes).
pub fn decode_quoted_printable(text: &str) -> String {
    let mut out = Vec::with_capacity(text.len());
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'=' if bytes.get(i + 1) == Some(&b'\n') => i += 2,
            b'=' if i + 2 < bytes.len() && bytes[i + 1].is_ascii_hexdigit() && bytes[i + 2].is_ascii_hexdigit() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).expect("ASCII");
                out.push(u8::from_str_radix(hex, 16).expect("hex digits"));
                i += 3;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A patch cut to the files under `folder`, and the changes it makes outside it: `(file, diff)`.
pub fn split(patch: &Patch, folder: &str) -> (Patch, Vec<(String, String)>) {
    let prefix = format!("{}/", folder.trim_matches('/'));
    let mut inside = String::new();
    let mut outside = Vec::new();
    for section in file_sections(&patch.diff) {
        let file = section
            .lines()
            .find_map(|l| l.strip_prefix("+++ b/").or_else(|| l.strip_prefix("--- a/")))
            .unwrap_or_default()
            .to_string();
        if file.starts_with(&prefix) {
            inside.push_str(section);
        } else {
            outside.push((file, section.to_string()));
        }
    }
    let files = patch.files.iter().filter(|f| f.starts_with(&prefix)).cloned().collect();
    (Patch { files, diff: inside, ..patch.clone() }, outside)
}

/// The diff's sections, one per file, each from its `diff --git` line.
fn file_sections(diff: &str) -> Vec<&str> {
    let mut starts: Vec<usize> = Vec::new();
    let mut offset = 0;
    for line in diff.split_inclusive('\n') {
        if line.starts_with("diff --git ") {
            starts.push(offset);
        }
        offset += line.len();
    }
    starts.iter().enumerate().map(|(i, &s)| &diff[s..starts.get(i + 1).copied().unwrap_or(diff.len())]).collect()
}

/// The lines a diff section adds and removes, without their `+`/`-`.
pub fn changed_lines(section: &str) -> impl Iterator<Item = &str> {
    section
        .lines()
        .filter(|l| !l.starts_with("+++ ") && !l.starts_with("--- "))
        .filter_map(|l| l.strip_prefix('+').or_else(|| l.strip_prefix('-')))
}

/// Applies `patch` to the tree at `root` (paths in the patch are `a/...`, `b/...`): exactly, or
/// not at all.
pub fn apply(patch: &Patch, root: &Path) -> Result<(), ImageError> {
    let dry = run_patch(patch, root, true)?;
    if !dry.0 {
        return Err(ImageError::Invalid(format!(
            "{} ({}) does not apply without fuzz to {}:\n{}",
            patch.file,
            patch.subject,
            root.display(),
            dry.1.trim_end()
        )));
    }
    let done = run_patch(patch, root, false)?;
    if !done.0 {
        return Err(ImageError::Tool { what: format!("applying {}", patch.file), detail: done.1 });
    }
    Ok(())
}

fn run_patch(patch: &Patch, root: &Path, dry_run: bool) -> Result<(bool, String), ImageError> {
    let mut command = Command::new("patch");
    command.args(["-p1", "--fuzz=0", "--forward", "--batch", "--no-backup-if-mismatch", "-d"]).arg(root);
    if dry_run {
        command.arg("--dry-run");
    }
    let mut child =
        command.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().map_err(|e| {
            ImageError::Tool { what: "patch".into(), detail: format!("cannot run patch: {e} (apt-get install patch)") }
        })?;
    child
        .stdin
        .take()
        .expect("piped")
        .write_all(patch.diff.as_bytes())
        .map_err(|source| ImageError::Io { path: root.to_path_buf(), source })?;
    let out = child.wait_with_output().map_err(|source| ImageError::Io { path: root.to_path_buf(), source })?;
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    Ok((out.status.success(), text))
}

#[cfg(test)]
mod tests {
    use super::*;

    const FORMAT_PATCH: &str = "From 3d7f53288291ecd6 Mon Sep 17 00:00:00 2001\n\
From: Yangyu Chen <cyy@cyyself.name>\n\
Date: Sat, 6 Sep 2025 21:54:34 +0800\n\
Subject: [PATCH] net: atlantic: make RX page order\n tunable via module param\n\
\n\
Explanation.\n\
---\n\
\x20a.c | 1 +\n\
\n\
diff --git a/a.c b/a.c\n\
index 1..2 100644\n\
--- a/a.c\n\
+++ b/a.c\n\
@@ -1,2 +1,3 @@\n\
\x20one\n\
+one and a half\n\
\x20two\n\
-- \n\
2.47.2\n";

    #[test]
    fn a_format_patch_file_gives_its_subject_author_and_diff() {
        let patches = parse("000.patch", FORMAT_PATCH).unwrap();
        assert_eq!(patches.len(), 1);
        let p = &patches[0];
        assert_eq!(p.subject, "net: atlantic: make RX page order tunable via module param");
        assert_eq!(p.author, "Yangyu Chen <cyy@cyyself.name>");
        assert_eq!(p.files, ["a.c"]);
        assert!(p.diff.starts_with("diff --git a/a.c b/a.c\n") && p.diff.ends_with(" two\n"), "{}", p.diff);
        assert_eq!(p.message_id, "", "format-patch writes none");
        let mail = FORMAT_PATCH.replace("Date:", "Message-Id: <20250906135434.1-cyy@cyyself.name>\nDate:");
        assert_eq!(parse("m", &mail).unwrap()[0].message_id, "20250906135434.1-cyy@cyyself.name");
    }

    #[test]
    fn mboxes_split_and_quoted_printable_decodes() {
        let second = FORMAT_PATCH.replace("[PATCH]", "[PATCH 2/2]").replace("one and a half", "=3D half");
        let qp = second.replace("Subject:", "Content-Transfer-Encoding: quoted-printable\nSubject:");
        let mbox = format!("{FORMAT_PATCH}{qp}");
        let patches = parse("series.mbox", &mbox).unwrap();
        assert_eq!(patches.len(), 2);
        assert!(patches[1].diff.contains("+= half\n"), "{}", patches[1].diff);
        assert_ne!(patches[0].sha256, patches[1].sha256);
        assert_eq!(decode_quoted_printable("a=\nb =3D c=20"), "ab = c ");
        assert!(matches!(parse("x", "just a mail\n"), Err(ImageError::Invalid(_))));
    }

    #[test]
    fn a_patch_splits_at_its_driver_s_folder() {
        let diff = "diff --git a/drv/Kconfig b/drv/Kconfig\n--- a/drv/Kconfig\n+++ b/drv/Kconfig\n@@ -1 +1,2 @@\n config X\n+\tselect PAGE_POOL\n\
                    diff --git a/drv/x/a.c b/drv/x/a.c\n--- a/drv/x/a.c\n+++ b/drv/x/a.c\n@@ -1 +1 @@\n-one\n+two\n";
        let patch = Patch {
            file: "p".into(),
            subject: "s".into(),
            author: "a".into(),
            message_id: String::new(),
            sha256: String::new(),
            files: vec!["drv/Kconfig".into(), "drv/x/a.c".into()],
            diff: diff.into(),
        };
        let (inside, outside) = split(&patch, "drv/x/");
        assert_eq!(inside.files, ["drv/x/a.c"]);
        assert!(inside.diff.starts_with("diff --git a/drv/x/a.c") && inside.diff.ends_with("+two\n"));
        assert_eq!(outside.len(), 1);
        assert_eq!(outside[0].0, "drv/Kconfig");
        assert_eq!(changed_lines(&outside[0].1).collect::<Vec<_>>(), ["\tselect PAGE_POOL"]);
        assert_eq!(inside.diff.len() + outside[0].1.len(), diff.len(), "nothing lost, nothing repeated");
    }

    #[test]
    fn patches_apply_exactly_or_not_at_all() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.c"), "one\ntwo\n").unwrap();
        let patch = &parse("000.patch", FORMAT_PATCH).unwrap()[0];
        apply(patch, dir.path()).unwrap();
        assert_eq!(std::fs::read_to_string(dir.path().join("a.c")).unwrap(), "one\none and a half\ntwo\n");
        let err = apply(patch, dir.path()).unwrap_err();
        assert!(err.is_bad_input() && err.to_string().contains("does not apply"), "{err}");
        std::fs::write(dir.path().join("a.c"), "one\nthree\n").unwrap();
        assert!(apply(patch, dir.path()).unwrap_err().to_string().contains("does not apply"));
        assert_eq!(std::fs::read_to_string(dir.path().join("a.c")).unwrap(), "one\nthree\n", "untouched");
    }
}
