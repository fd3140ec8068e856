//! KTAP, as the kernel's selftests print it: the kselftest runner's TAP 13 (one result per test
//! program, its output in `# `-prefixed lines before its result; tools/testing/selftests/
//! kselftest/runner.sh) around each program's own KTAP v1 (the netdev suite's
//! tools/testing/selftests/net/lib/py/ksft.py: `KTAP version 1`, `1..N`, `ok N name`, `not ok N
//! name`, a `# SKIP reason` or `# XFAIL reason` directive, `# Totals: ...`), nested to any depth
//! by a `# ` prefix or an indentation of four spaces. What a test printed between results is
//! kept as the diagnostic of the next one. A plan that is not met (a guest that crashed in the
//! middle) is reported with the last test that started.

use serde::{Deserialize, Serialize};

/// A test's result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, strum::Display)]
#[serde(rename_all = "UPPERCASE")]
#[strum(serialize_all = "UPPERCASE")]
pub enum KtapStatus {
    /// `ok`.
    Pass,
    /// `not ok`.
    Fail,
    /// `# SKIP`.
    Skip,
    /// `# XFAIL`: failed as expected.
    Xfail,
}

/// One test's result, with its subtests.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KtapTest {
    /// Its name, as its result line gives it.
    pub name: String,
    /// Its result.
    pub status: KtapStatus,
    /// The directive's words (the reason of a SKIP or XFAIL, `exit=1`, `TIMEOUT 45 seconds`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Its subtests, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub subtests: Vec<KtapTest>,
}

impl KtapTest {
    /// Its name without the runner's `selftests: COLLECTION: ` prefix (`ping.py`).
    pub fn short_name(&self) -> &str {
        self.name.rsplit(": ").next().unwrap_or(&self.name)
    }
}

/// A parsed KTAP document (or level of one).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ktap {
    /// The tests' results, in order.
    pub tests: Vec<KtapTest>,
    /// How many tests the plan (`1..N`) announced.
    pub planned: Option<usize>,
    /// The test that started last but has no result: where a crash struck.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unfinished: Option<String>,
}

impl Ktap {
    /// Whether every planned test has a result.
    pub fn complete(&self) -> bool {
        self.planned.is_some_and(|n| n == self.tests.len()) && self.unfinished.is_none()
    }

    /// What failed: each failed subtest by name, or a failed test with no failed subtest by its
    /// name and directive (`ping.py (exit=1)`: an error outside its subtests, a timeout).
    pub fn failed(&self) -> Vec<String> {
        let mut failed = Vec::new();
        for test in self.tests.iter().filter(|t| t.status == KtapStatus::Fail) {
            let subtests: Vec<String> =
                test.subtests.iter().filter(|s| s.status == KtapStatus::Fail).map(|s| s.name.clone()).collect();
            if subtests.is_empty() {
                let name = test.short_name();
                failed.push(match &test.reason {
                    Some(reason) => format!("{name} ({reason})"),
                    None => name.to_string(),
                });
            }
            failed.extend(subtests);
        }
        failed
    }

    /// Parses `text`, an output that may hold other lines (a console's) before and after.
    pub fn parse(text: &str) -> Ktap {
        let lines: Vec<&str> = text.lines().map(|l| l.trim_end_matches('\r')).collect();
        parse_level(&lines)
    }
}

/// The body of a nested line (`# ` or four spaces), if it is one.
fn nested(line: &str) -> Option<&str> {
    line.strip_prefix("# ").or_else(|| line.strip_prefix("    ")).or_else(|| (line == "#").then_some(""))
}

/// A result line: whether it passed, its number, its name, its directive.
fn result_line(line: &str) -> Option<(bool, &str, Option<&str>)> {
    let (ok, rest) = match line.strip_prefix("not ok ") {
        Some(rest) => (false, rest),
        None => (true, line.strip_prefix("ok ")?),
    };
    let (number, rest) = rest.split_once(' ').unwrap_or((rest, ""));
    number.parse::<usize>().ok()?;
    let (name, directive) = match rest.split_once(" # ") {
        Some((name, directive)) => (name, Some(directive.trim())),
        None => (rest.strip_suffix(" #").unwrap_or(rest), None),
    };
    Some((ok, name.trim(), directive))
}

/// One test's result from its line, with the subtests printed before it.
fn test(ok: bool, name: &str, directive: Option<&str>, subtests: Vec<KtapTest>) -> KtapTest {
    let word = directive.and_then(|d| d.split_whitespace().next()).map(str::to_ascii_uppercase);
    let rest = |d: &str| d.split_once(' ').map(|(_, r)| r.trim().to_string()).filter(|r| !r.is_empty());
    let (status, reason) = match (ok, word.as_deref(), directive) {
        (_, Some("SKIP"), Some(d)) => (KtapStatus::Skip, rest(d)),
        (_, Some("XFAIL"), Some(d)) => (KtapStatus::Xfail, rest(d)),
        (true, _, d) => (KtapStatus::Pass, d.map(String::from)),
        (false, _, d) => (KtapStatus::Fail, d.map(String::from)),
    };
    KtapTest { name: name.to_string(), status, reason, subtests }
}

/// One level: its plan and results; the nested lines before a result are its subtests.
fn parse_level(lines: &[&str]) -> Ktap {
    let mut ktap = Ktap::default();
    let mut inner: Vec<&str> = Vec::new();
    let mut started: Option<String> = None;
    for line in lines {
        if let Some(body) = nested(line) {
            // The runner names the program it starts: `# selftests: drivers/net: ping.py`.
            if let Some(program) = body.strip_prefix("selftests: ") {
                started = Some(format!("selftests: {program}"));
            }
            inner.push(body);
        } else if let Some(n) = line.strip_prefix("1..").and_then(|n| n.trim().parse().ok()) {
            ktap.planned = Some(n);
        } else if let Some((ok, name, directive)) = result_line(line) {
            let subtests = parse_level(&inner).tests;
            inner.clear();
            started = None;
            ktap.tests.push(test(ok, name, directive, subtests));
        }
    }
    // Output after the last result: a test that started and never ended.
    let rest = parse_level_tail(&inner);
    let at = match (started, rest) {
        (Some(program), Some(inside)) => Some(format!("{program}, {inside}")),
        (program, inside) => program.or(inside),
    };
    ktap.unfinished = at.filter(|_| ktap.planned.is_none_or(|n| n != ktap.tests.len()));
    ktap
}

/// Where a level's unfinished output stopped: the last subtest result inside it, if any.
fn parse_level_tail(inner: &[&str]) -> Option<String> {
    if inner.is_empty() {
        return None;
    }
    let nested = parse_level(inner);
    nested.unfinished.or_else(|| nested.tests.last().map(|t| format!("after {}", t.name)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `make -C tools/testing/selftests TARGETS=drivers/net run_tests` prints for ping.py and
    /// stats.py, in the shapes runner.sh and ksft.py give it (6.12).
    const RUN: &str = "\
TAP version 13
1..2
# timeout set to 45
# selftests: drivers/net: ping.py
# KTAP version 1
# 1..3
# ok 1 ping.test_v4
# ok 2 ping.test_v6 # SKIP Test requires IPv6 connectivity
# # Exception| Traceback (most recent call last):
# # Exception| AssertionError: ping failed
# not ok 3 ping.test_tcp
# # Totals: pass:1 fail:1 xfail:0 xpass:0 skip:1 error:0
not ok 1 selftests: drivers/net: ping.py # exit=1
# timeout set to 45
# selftests: drivers/net: stats.py
# KTAP version 1
# 1..2
# ok 1 stats.check_pause # XFAIL pause not supported by the device
# ok 2 stats.pkt_byte_sum
# # Totals: pass:1 fail:0 xfail:1 xpass:0 skip:0 error:0
ok 2 selftests: drivers/net: stats.py
";

    #[test]
    fn the_runner_s_tap_and_each_program_s_ktap_nest() {
        let ktap = Ktap::parse(RUN);
        assert!(ktap.complete(), "{ktap:?}");
        assert_eq!(ktap.tests.len(), 2);
        let ping = &ktap.tests[0];
        assert_eq!(
            (ping.name.as_str(), ping.status, ping.reason.as_deref()),
            ("selftests: drivers/net: ping.py", KtapStatus::Fail, Some("exit=1"))
        );
        let sub: Vec<(&str, KtapStatus, Option<&str>)> =
            ping.subtests.iter().map(|t| (t.name.as_str(), t.status, t.reason.as_deref())).collect();
        assert_eq!(
            sub,
            vec![
                ("ping.test_v4", KtapStatus::Pass, None),
                ("ping.test_v6", KtapStatus::Skip, Some("Test requires IPv6 connectivity")),
                ("ping.test_tcp", KtapStatus::Fail, None),
            ]
        );
        let stats = &ktap.tests[1];
        assert_eq!(stats.status, KtapStatus::Pass);
        assert_eq!(stats.subtests[0].status, KtapStatus::Xfail);
        assert_eq!(stats.subtests[0].reason.as_deref(), Some("pause not supported by the device"));
    }

    #[test]
    fn a_crash_in_the_middle_names_the_test_that_was_running() {
        let cut = RUN.split("# ok 2 stats.pkt_byte_sum").next().unwrap();
        let ktap = Ktap::parse(&format!("{cut}[   12.3] BUG: kernel NULL pointer dereference\n"));
        assert!(!ktap.complete());
        assert_eq!(ktap.tests.len(), 1);
        assert_eq!(ktap.unfinished.as_deref(), Some("selftests: drivers/net: stats.py, after stats.check_pause"));
        assert_eq!(ktap.failed(), ["ping.test_tcp"]);
    }

    #[test]
    fn indentation_nests_too_and_other_lines_are_ignored() {
        let text = "console noise\nKTAP version 1\n1..1\n    KTAP version 1\n    1..2\n    ok 1 a\n    not ok 2 b # TIMEOUT 45 seconds\nnot ok 1 suite\n";
        let ktap = Ktap::parse(text);
        assert!(ktap.complete());
        let subs = &ktap.tests[0].subtests;
        assert_eq!((subs[1].status, subs[1].reason.as_deref()), (KtapStatus::Fail, Some("TIMEOUT 45 seconds")));
        assert_eq!(Ktap::parse("").planned, None);
    }
}
