//! Checks every register address, bit and descriptor field the AQC100 model uses against the
//! Linux atlantic driver's own definitions (`drivers/net/ethernet/aquantia/atlantic` of Debian's
//! linux-source-6.12; `scripts/fetch-atlantic-source.sh` unpacks it and prints the path, which
//! goes in DRIVERLAB_ATLANTIC_SOURCE). Skips, saying why, where the source is absent.

#![allow(clippy::unwrap_used)] // a test's unwrap is its assertion

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use device_models::aqc100::regs::{LINUX, LINUX_BITS, LinuxDefinition};

/// What the driver's sources define.
#[derive(Default)]
struct Definitions {
    /// `#define NAME value` and `NAME = value` enum entries.
    values: HashMap<String, u64>,
    /// `#define NAME(x) (base + (x) * stride)`.
    indexed: HashMap<String, (u64, u64)>,
    /// `#define NAME BIT(n)`.
    bits: HashMap<String, u32>,
    /// `static u32 NAME[] = { ... }`.
    arrays: HashMap<String, Vec<u64>>,
}

fn number(text: &str) -> Option<u64> {
    let t = text.trim().trim_start_matches('(').trim_end_matches(')').trim();
    let t = t.trim_end_matches(['u', 'U', 'l', 'L']);
    if let Some(hex) = t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        u64::from_str_radix(hex, 16).ok()
    } else {
        t.parse().ok()
    }
}

/// Parses `(0x00005b00u + (descriptor) * 0x20)`.
fn indexed(body: &str) -> Option<(u64, u64)> {
    let compact: String = body.chars().filter(|c| !c.is_whitespace()).collect();
    let inner = compact.strip_prefix('(')?.strip_suffix(')')?;
    let (base, rest) = inner.split_once('+')?;
    let (_, stride) = rest.split_once('*')?;
    Some((number(base)?, number(stride)?))
}

fn parse_file(text: &str, defs: &mut Definitions) {
    let joined = text.replace("\\\n", " ");
    for line in joined.lines() {
        let line = line.split("/*").next().unwrap_or("").trim();
        if let Some(rest) = line.strip_prefix("#define") {
            let rest = rest.trim();
            if let Some(paren) = rest.find('(')
                && !rest[..paren].contains(char::is_whitespace)
            {
                let name = &rest[..paren];
                if let Some(close) = rest[paren..].find(')')
                    && let Some(value) = indexed(&rest[paren + close + 1..])
                {
                    defs.indexed.insert(name.to_string(), value);
                }
                continue;
            }
            let mut parts = rest.splitn(2, char::is_whitespace);
            let (Some(name), Some(body)) = (parts.next(), parts.next()) else { continue };
            let body = body.trim();
            if let Some(bit) = body.strip_prefix("BIT(").and_then(|b| b.strip_suffix(')')) {
                if let Some(n) = number(bit) {
                    defs.bits.insert(name.to_string(), n as u32);
                }
            } else if let Some(v) = number(body) {
                defs.values.insert(name.to_string(), v);
            }
        } else if let Some((name, value)) = line.trim_end_matches(',').split_once('=')
            && !name.trim().contains(char::is_whitespace)
            && let Some(v) = number(value)
        {
            defs.values.entry(name.trim().to_string()).or_insert(v);
        }
    }
    // static u32 NAME[32] = { a, b, ... };
    let mut rest = joined.as_str();
    while let Some(at) = rest.find("static u32 ") {
        rest = &rest[at + "static u32 ".len()..];
        let name_len = rest.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(rest.len());
        let (name, after) = rest.split_at(name_len);
        let Some(after) = after.strip_prefix('[') else { continue };
        let Some((size, after)) = after.split_once(']') else { continue };
        let Some(body) = after.trim_start().strip_prefix('=').map(str::trim_start) else { continue };
        let Some(body) = body.strip_prefix('{') else { continue };
        let Some((list, _)) = body.split_once('}') else { continue };
        if size.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            defs.arrays.insert(name.to_string(), list.split(',').filter_map(number).collect());
        }
    }
}

fn definitions(dir: &Path) -> Definitions {
    let mut defs = Definitions::default();
    for sub in [dir.to_path_buf(), dir.join("hw_atl")] {
        let Ok(entries) = std::fs::read_dir(&sub) else { continue };
        for entry in entries.flatten() {
            let path = entry.path();
            if matches!(path.extension().and_then(|e| e.to_str()), Some("c" | "h"))
                && let Ok(text) = std::fs::read_to_string(&path)
            {
                parse_file(&text, &mut defs);
            }
        }
    }
    defs
}

/// The driver's source folder: `None` (the test skips) when `DRIVERLAB_ATLANTIC_SOURCE` is not
/// set; a folder without the driver's headers is a failure, not a skip.
fn source() -> Option<PathBuf> {
    let dir = PathBuf::from(std::env::var_os("DRIVERLAB_ATLANTIC_SOURCE")?);
    let header = dir.join("hw_atl/hw_atl_llh_internal.h");
    assert!(header.is_file(), "DRIVERLAB_ATLANTIC_SOURCE={}: no {}", dir.display(), header.display());
    Some(dir)
}

#[test]
fn the_model_agrees_with_the_linux_driver() {
    let Some(dir) = source() else {
        let why = "DRIVERLAB_ATLANTIC_SOURCE is not set (run scripts/fetch-atlantic-source.sh and export its output)";
        testkit::skip("the_model_agrees_with_the_linux_driver", testkit::Lacks::Setup, why);
        return;
    };
    let defs = definitions(&dir);
    let mut problems = Vec::new();
    for def in LINUX {
        let problem = match *def {
            LinuxDefinition::Value(name, want) => match defs.values.get(name) {
                Some(&got) if got == want as u64 => None,
                Some(&got) => Some(format!("{name}: Linux {got:#x}, model {want:#x}")),
                None => Some(format!("{name}: not defined in {}", dir.display())),
            },
            LinuxDefinition::Indexed(name, base, stride) => match defs.indexed.get(name) {
                Some(&(b, s)) if (b, s) == (base as u64, stride as u64) => None,
                Some(&(b, s)) => Some(format!("{name}: Linux {b:#x} + n * {s:#x}, model {base:#x} + n * {stride:#x}")),
                None => Some(format!("{name}(n): not defined in {}", dir.display())),
            },
            LinuxDefinition::Array(name, want) => match defs.arrays.get(name) {
                Some(got) if got.len() >= 2 && got[..2] == [want[0] as u64, want[1] as u64] => None,
                Some(got) => Some(format!("{name}: Linux starts {:#x?}, model {want:#x?}", &got[..got.len().min(2)])),
                None => Some(format!("{name}[]: not found in {}", dir.display())),
            },
        };
        problems.extend(problem);
    }
    for &(name, want) in LINUX_BITS {
        match defs.bits.get(name) {
            Some(&bit) if 1u32.checked_shl(bit) == Some(want) => {}
            Some(&bit) => problems.push(format!("{name}: Linux BIT({bit}), model {want:#x}")),
            None => problems.push(format!("{name}: not defined as BIT(n) in {}", dir.display())),
        }
    }
    let checked = LINUX.len() + LINUX_BITS.len();
    assert!(problems.is_empty(), "{} of {checked} definitions disagree:\n{}", problems.len(), problems.join("\n"));
    eprintln!("{checked} register and descriptor definitions agree with {}", dir.display());
}

#[test]
fn the_parser_reads_the_forms_linux_uses() {
    let mut defs = Definitions::default();
    parse_file(
        "#define HW_ATL_X_ADR 0x00005b00u\n#define HW_ATL_Y_ADR(descriptor) \\\n\t(0x00007c10u + (descriptor) * 0x40)\n\
         #define HW_ATL_Z BIT(22)\nenum r {\n\tFW2X_RATE_10G     = 0x800,\n};\n\
         static u32 itr_a_msk[32] = {\n\t0x00001f00U, 0x0000001FU,\n};\n#define HW_ATL_W_MSK 0x80000000 /* x */\n",
        &mut defs,
    );
    assert_eq!(defs.values.get("HW_ATL_X_ADR"), Some(&0x5b00));
    assert_eq!(defs.values.get("HW_ATL_W_MSK"), Some(&0x8000_0000));
    assert_eq!(defs.indexed.get("HW_ATL_Y_ADR"), Some(&(0x7c10, 0x40)));
    assert_eq!(defs.bits.get("HW_ATL_Z"), Some(&22));
    assert_eq!(defs.values.get("FW2X_RATE_10G"), Some(&0x800));
    assert_eq!(defs.arrays.get("itr_a_msk").map(|v| v[..2].to_vec()), Some(vec![0x1f00, 0x1f]));
}
