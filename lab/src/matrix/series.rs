//! A patch series as a matrix axis. An image with `series` (the files of a mailed series: an
//! mbox, `git format-patch` files, a folder of them) stands for one image per prefix: the base
//! (the image's own `patches`, none by default), then the series' patches added one at a time,
//! `1/N` to `N/N`; and each variant on it stands for one variant per prefix. [`expand`] writes
//! them out before the matrix is checked, so that the rest of the lab sees plain images and
//! variants, each marked with its [`SeriesStep`] for the report's curve and for what is not
//! built after a prefix that did not build.

use std::collections::{BTreeMap, BTreeSet};

use guest_images::patches::{Patch, PatchFile};
use serde::{Deserialize, Serialize};
use toml::Spanned;

use super::check::Checker;
use super::{Image, InitrdRef, KernelRef, MAX_NAME, Matrix, MatrixError, PatchRef, PinnedPrefix};

/// Most patches one series may have.
pub const MAX_SERIES: usize = 64;

/// Where in its series an image or variant is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct SeriesStep {
    /// The image that names the series, as the matrix writes it.
    pub series: String,
    /// Patches of the series applied: 0 for the base, K for the prefix K/N.
    pub index: usize,
    /// Patches in the series (N).
    pub count: usize,
    /// The subject of the prefix's last patch (none for the base).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub subject: String,
    /// Its author.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub author: String,
    /// Its mail's Message-ID, when it came as a mail.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message_id: String,
    /// The variant as the matrix writes it (for a variant's step; none for an image's).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub variant: String,
}

impl SeriesStep {
    /// `base`, or `K/N SUBJECT`.
    pub fn label(&self) -> String {
        match self.index {
            0 => "base".into(),
            k => format!("{k}/{} {}", self.count, self.subject),
        }
    }

    /// `K/N` (`0/N` for the base).
    pub fn position(&self) -> String {
        format!("{}/{}", self.index, self.count)
    }

    /// The name of the image the prefix runs on: the series' image, `@K`.
    pub fn image_name(&self) -> String {
        format!("{}@{}", self.series, self.index)
    }

    /// The name of `variant` on the prefix: `VARIANT@0` for the base, `VARIANT@K-SUBJECT` (the
    /// subject as one word: letters, digits, `_` and `.`, the rest as `-`) for the others.
    pub fn variant_name(&self, variant: &str) -> String {
        if self.index == 0 {
            return format!("{variant}@0");
        }
        let mut slug = String::new();
        for c in self.subject.chars() {
            if c.is_alphanumeric() || c == '_' || c == '.' {
                slug.push(c);
            } else if !slug.is_empty() && !slug.ends_with('-') {
                slug.push('-');
            }
        }
        format!("{variant}@{}-{}", self.index, slug.trim_end_matches('-'))
    }
}

/// Writes out every image of `matrix` with a series as one image per prefix, and every variant
/// on such an image as one variant per prefix ([`SeriesStep::variant_name`]). A
/// baseline naming such a variant names its base; with no baseline, the first series' base is
/// the baseline. Errors name the image and what to do.
pub(super) fn expand(matrix: &mut Matrix, checker: &Checker) -> Result<(), MatrixError> {
    let mut steps: BTreeMap<String, Vec<SeriesStep>> = BTreeMap::new();
    let mut images = Vec::with_capacity(matrix.images.len());
    for (i, spanned) in std::mem::take(&mut matrix.images).into_iter().enumerate() {
        if spanned.get_ref().series.is_empty() {
            images.push(spanned);
            continue;
        }
        let span = spanned.span();
        let image = spanned.into_inner();
        let patches = read(&image).map_err(|(field, why)| checker.error(Some(span.clone()), field(i), why))?;
        fits(&image, &patches, matrix)
            .map_err(|why| checker.error(Some(span.clone()), format!("image[{i}].series"), why))?;
        let mut series = prefixes(&image, &patches);
        apply_pins(&mut series, &image.pinned)
            .map_err(|why| checker.error(Some(span.clone()), format!("image[{i}].pinned"), why))?;
        steps.insert(image.name.clone(), series.iter().filter_map(|p| p.step.clone()).collect());
        images.extend(series.into_iter().map(|p| Spanned::new(span.clone(), p)));
    }
    matrix.images = images;
    if steps.is_empty() {
        return Ok(());
    }
    let mut bases = Vec::new();
    let mut variants = Vec::with_capacity(matrix.variants.len());
    for spanned in std::mem::take(&mut matrix.variants) {
        let Some(series) = steps.get(spanned.get_ref().image.get_ref()) else {
            variants.push(spanned);
            continue;
        };
        let span = spanned.span();
        let variant = spanned.get_ref();
        for step in series {
            let mut prefix = variant.clone();
            prefix.name = shortened(step.variant_name(&variant.name));
            prefix.image = Spanned::new(variant.image.span(), step.image_name());
            prefix.step = Some(SeriesStep { variant: variant.name.clone(), ..step.clone() });
            if step.index == 0 {
                bases.push((variant.name.clone(), prefix.name.clone()));
            }
            variants.push(Spanned::new(span.clone(), prefix));
        }
    }
    matrix.variants = variants;
    let baseline = match &matrix.baseline {
        Some(named) => bases.iter().find(|(v, _)| v == named.get_ref()).map(|(_, base)| (named.span(), base)),
        None => bases.first().map(|(_, base)| (0..0, base)),
    };
    if let Some((span, base)) = baseline {
        matrix.baseline = Some(Spanned::new(span, base.clone()));
    }
    Ok(())
}

/// The name of the workload `--every-prefix` adds.
pub const PREFIX_CHECK: &str = "prefix-check";

/// The matrix `text` with a prefix check as its first workload (`lab run --every-prefix`):
/// iperf3 from the peer for 2 s, run once per cell before every other cell, so that every
/// prefix of the series is seen to load, link, pass traffic and unload with no warning and no
/// mapping left before any long workload. Refused for a matrix without a series, or with a
/// workload of that name already.
pub fn every_prefix(text: &str) -> Result<String, String> {
    let mut table: toml::Table = text.parse().map_err(|e: toml::de::Error| e.message().to_string())?;
    let has_series = table
        .get("image")
        .and_then(toml::Value::as_array)
        .is_some_and(|images| images.iter().any(|i| i.get("series").is_some()));
    if !has_series {
        return Err("--every-prefix checks the prefixes of a series: the matrix has no image with `series`".into());
    }
    let workloads = table.entry("workload").or_insert_with(|| toml::Value::Array(Vec::new()));
    let Some(workloads) = workloads.as_array_mut() else { return Err("`workload` is no list of tables".into()) };
    if workloads.iter().any(|w| w.get("name").and_then(toml::Value::as_str) == Some(PREFIX_CHECK)) {
        return Err(format!("--every-prefix adds a workload {PREFIX_CHECK:?}, and the matrix has one"));
    }
    let check: toml::Table = format!(
        "name = \"{PREFIX_CHECK}\"\nkind = \"iperf3\"\ndirection = \"rx\"\nduration_s = 2\nprefix_check = true\n"
    )
    .parse()
    .expect("a valid table");
    workloads.insert(0, toml::Value::Table(check));
    toml::to_string(&table).map_err(|e| e.to_string())
}

/// What a field's error is: the field (given the image's index) and why.
type ReadError = (fn(usize) -> String, String);

/// The patches of an image's series, in order: from the texts the matrix carries (a matrix read
/// from a file has its series' files written in by [`crate::recipe::inline_series`]).
fn read(image: &Image) -> Result<Vec<Patch>, ReadError> {
    let field: fn(usize) -> String = |i| format!("image[{i}].series");
    if !image.is_agent_initrd() {
        return Err((
            field,
            "a series builds the driver into the initramfs the lab makes: give initrd = \"agent\"".into(),
        ));
    }
    let mut patches = Vec::new();
    for entry in &image.series {
        let file = match entry {
            PatchRef::Text(file) => file,
            PatchRef::Path(path) => {
                let why = format!(
                    "{}: the series' files were not read: over the API a series is its files' names and texts \
                     (`driverlab lab run --url` sends them so)",
                    path.display()
                );
                return Err((field, why));
            }
        };
        patches.extend(file.parse().map_err(|e| (field, e.to_string()))?);
    }
    if patches.len() > MAX_SERIES {
        return Err((field, format!("{} patches; a series has at most {MAX_SERIES}", patches.len())));
    }
    Ok(patches)
}

/// Why the series `patches` does not fit `image` and the matrix's devices, if it does not: it
/// must change the image's driver, and that driver must be the devices'.
fn fits(image: &Image, patches: &[Patch], matrix: &Matrix) -> Result<(), String> {
    let folder = format!("{}/", image.driver.trim_end_matches('/'));
    if !patches.iter().flat_map(|p| &p.files).any(|f| f.starts_with(&folder)) {
        let touched: BTreeSet<&str> =
            patches.iter().flat_map(|p| &p.files).map(|f| f.rsplit_once('/').map_or(f.as_str(), |(d, _)| d)).collect();
        let known = vm_spec::NicKind::ALL.map(|n| format!("{} ({})", n.linux_driver(), n.name())).join(", ");
        return Err(format!(
            "the series changes nothing in {} (the image's driver): it changes {}; a series runs on the devices \
             of its driver, and this lab has models of {known} (set `driver` to the series' driver folder for a \
             device of that kind)",
            folder.trim_end_matches('/'),
            touched.into_iter().collect::<Vec<_>>().join(", ")
        ));
    }
    let module = image.module_name();
    if let Some(device) = matrix.devices.iter().map(|d| d.get_ref()).find(|d| d.linux_driver() != module) {
        return Err(format!(
            "the series builds {module}, and device {:?} is driven by {}: give the series devices of its kind",
            device.name,
            device.linux_driver()
        ));
    }
    Ok(())
}

/// The prefixes of `image`'s series as images to build (its `pinned` aside): what `lab pin`
/// builds. The series' files must be texts.
pub fn prefix_images(image: &Image) -> Result<Vec<Image>, String> {
    let patches = read(image).map_err(|(_, why)| why)?;
    Ok(prefixes(image, &patches))
}

/// The prefixes `pinned` names as the images `lab pin` built (a prefix that did not build kept
/// as its reason, the ones after it as they were, never built); refused for a list that does not
/// fit the series or names no image IDs.
fn apply_pins(prefixes: &mut [Image], pinned: &[PinnedPrefix]) -> Result<(), String> {
    if pinned.is_empty() {
        return Ok(());
    }
    let ends_in_failure = pinned.last().is_some_and(|p| p.build_failed.is_some());
    if pinned.len() > prefixes.len() || (pinned.len() < prefixes.len() && !ends_in_failure) {
        return Err(format!(
            "{} prefixes pinned for a series of {} (what `lab pin` writes)",
            pinned.len(),
            prefixes.len()
        ));
    }
    for (prefix, pin) in prefixes.iter_mut().zip(pinned) {
        match (pin, &pin.build_failed) {
            (
                PinnedPrefix { kernel: Some(KernelRef::Store(_)), initrd: None | Some(InitrdRef::Store(_)), .. },
                None,
            ) => {
                prefix.kernel = pin.kernel.clone().expect("matched");
                prefix.initrd = pin.initrd.clone();
                prefix.patches = Vec::new();
            }
            (PinnedPrefix { kernel: None, initrd: None, .. }, Some(why)) => prefix.unbuilt = Some(why.clone()),
            _ => {
                return Err("each prefix is its kernel and initramfs images' IDs, or `build_failed` alone".into());
            }
        }
    }
    Ok(())
}

/// The series' prefixes as images: the base, then each patch added in turn.
fn prefixes(image: &Image, patches: &[Patch]) -> Vec<Image> {
    let count = patches.len();
    (0..=count)
        .map(|index| {
            let last = index.checked_sub(1).map(|k| &patches[k]);
            let step = SeriesStep {
                series: image.name.clone(),
                index,
                count,
                subject: last.map(|p| p.subject.clone()).unwrap_or_default(),
                author: last.map(|p| p.author.clone()).unwrap_or_default(),
                message_id: last.map(|p| p.message_id.clone()).unwrap_or_default(),
                variant: String::new(),
            };
            let applied = patches[..index].iter().enumerate().map(|(k, p)| PatchRef::Text(mail(p, k + 1, count)));
            Image {
                name: step.image_name(),
                patches: image.patches.iter().cloned().chain(applied).collect(),
                series: Vec::new(),
                pinned: Vec::new(),
                step: Some(step),
                ..image.clone()
            }
        })
        .collect()
}

/// Patch `index` of `count` as a mail of its own, which parses back into the same patch.
fn mail(patch: &Patch, index: usize, count: usize) -> PatchFile {
    let mut text = format!("From: {}\nSubject: [PATCH {index}/{count}] {}\n", patch.author, patch.subject);
    if !patch.message_id.is_empty() {
        text.push_str(&format!("Message-ID: <{}>\n", patch.message_id));
    }
    text.push('\n');
    text.push_str(&patch.diff);
    PatchFile { name: format!("{} {index}/{count}", patch.file), text }
}

/// `name` cut to [`MAX_NAME`] bytes, at a character's boundary.
fn shortened(mut name: String) -> String {
    if name.len() > MAX_NAME {
        let end = (0..=MAX_NAME).rev().find(|&i| name.is_char_boundary(i)).unwrap_or(0);
        name.truncate(end);
    }
    name
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::super::Plan;
    use super::*;

    /// A mail of one patch to the atlantic driver's `file`.
    fn patch(n: usize, subject: &str, file: &str) -> String {
        format!(
            "From: Dev <dev@example.org>\nSubject: [PATCH {n}/3] {subject}\nMessage-ID: <{n}@example.org>\n\n---\n\
             diff --git a/drivers/net/ethernet/aquantia/atlantic/{file} b/drivers/net/ethernet/aquantia/atlantic/{file}\n\
             --- a/drivers/net/ethernet/aquantia/atlantic/{file}\n+++ b/drivers/net/ethernet/aquantia/atlantic/{file}\n\
             @@ -1 +1,2 @@\n one\n+two\n"
        )
    }

    fn mbox() -> String {
        (1..=3)
            .map(|n| format!("From x Mon Sep 17 00:00:00 2001\n{}", patch(n, &format!("step {n}"), "aq_nic.c")))
            .collect()
    }

    fn matrix(series: &str, extra: &str) -> String {
        let text = toml::Value::String(series.into());
        format!(
            "name = \"s\"\nrepetitions = 2\n{extra}\n[[device]]\nname = \"aq\"\nmodel = \"aqc100\"\n\
             [[image]]\nname = \"atl\"\nengine = \"qemu\"\nkernel = \"debian\"\ninitrd = \"agent\"\n\
             series = [{{ name = \"s.mbox\", text = {text} }}]\n\
             [[variant]]\nname = \"v\"\nimage = \"atl\"\nparams = {{ \"atlantic.x\" = [1, 2] }}\n\
             [[workload]]\nname = \"rx\"\nkind = \"iperf3\"\n"
        )
    }

    fn parse(text: &str) -> Result<Plan, MatrixError> {
        Plan::parse(Path::new("s.toml"), text)
    }

    #[test]
    fn a_series_is_one_image_and_one_variant_per_prefix() {
        let plan = parse(&matrix(&mbox(), "")).unwrap();
        let images: Vec<&str> = plan.matrix.images.iter().map(|i| i.get_ref().name.as_str()).collect();
        assert_eq!(images, ["atl@0", "atl@1", "atl@2", "atl@3"]);
        let patches: Vec<usize> = plan.matrix.images.iter().map(|i| i.get_ref().patches.len()).collect();
        assert_eq!(patches, [0, 1, 2, 3], "each prefix carries the patches before it");
        let variants: Vec<&str> = plan.matrix.variants.iter().map(|v| v.get_ref().name.as_str()).collect();
        assert_eq!(variants, ["v@0", "v@1-step-1", "v@2-step-2", "v@3-step-3"]);
        assert_eq!(plan.baseline(), Some("v@0"), "the base is the baseline when none is named");
        assert_eq!(plan.cells.len(), 8, "4 prefixes x 2 parameter values");
        let step = plan.cells[7].step.as_ref().unwrap();
        assert_eq!(
            (step.index, step.count, step.subject.as_str(), step.message_id.as_str(), step.variant.as_str()),
            (3, 3, "step 3", "3@example.org", "v")
        );
        assert_eq!(step.author, "Dev <dev@example.org>");
        // Each prefix's patches read back as the series' own.
        let third = plan.image("atl@3").unwrap();
        let PatchRef::Text(file) = &third.patches[2] else { panic!("a text") };
        let read = file.parse().unwrap();
        assert_eq!((read[0].subject.as_str(), read[0].message_id.as_str()), ("step 3", "3@example.org"));
        let original = guest_images::patches::parse("s.mbox", &mbox()).unwrap();
        assert_eq!(read[0].sha256, original[2].sha256, "the same diff");
        // The run stores the matrix as written; it expands the same again.
        assert_eq!(parse(&plan.text).unwrap().cells, plan.cells);
    }

    #[test]
    fn a_named_baseline_on_the_series_is_its_base_and_other_variants_stay() {
        let extra = "baseline = \"v\"";
        let text = matrix(&mbox(), extra).replace(
            "[[workload]]",
            "[[image]]\nname = \"stock\"\nengine = \"qemu\"\nkernel = \"debian\"\ninitrd = \"agent\"\n\
             [[variant]]\nname = \"stock\"\nimage = \"stock\"\n[[workload]]",
        );
        let plan = parse(&text).unwrap();
        assert_eq!(plan.baseline(), Some("v@0"));
        assert!(plan.variant("stock").is_some_and(|v| v.step.is_none()));
        let stock = parse(&text.replace("baseline = \"v\"", "baseline = \"stock\"")).unwrap();
        assert_eq!(stock.baseline(), Some("stock"));
    }

    #[test]
    fn a_series_that_cannot_run_here_is_refused_saying_why() {
        let refused = |text: &str| parse(text).unwrap_err().to_string();
        let mediatek = patch(1, "mtk: prefetch", "x.c").replace("aquantia/atlantic", "mediatek");
        let e = refused(&matrix(&mediatek, ""));
        assert!(
            e.contains("image[0].series") && e.contains("changes nothing in drivers/net/ethernet/aquantia/atlantic"),
            "{e}"
        );
        assert!(e.contains("drivers/net/ethernet/mediatek") && e.contains("atlantic (aqc100)"), "{e}");
        let e = refused(&matrix("Subject: [PATCH] words only\n\nno diff here\n", ""));
        assert!(e.contains("no patch in it"), "{e}");
        let e = refused(&matrix(&mbox(), "").replace("initrd = \"agent\"\n", ""));
        assert!(e.contains("give initrd = \\\"agent\\\"") || e.contains("initrd = \"agent\""), "{e}");
        let lan = matrix(&mbox(), "").replace("model = \"aqc100\"", "model = \"lan743x\"");
        let e = refused(&lan);
        assert!(e.contains("device \"aq\" is driven by lan743x"), "{e}");
        let long: String = (1..=MAX_SERIES + 1)
            .map(|n| format!("From x Mon Sep 17 00:00:00 2001\n{}", patch(n, "p", "a.c")))
            .collect();
        assert!(refused(&matrix(&long, "")).contains("at most 64"));
        let path = matrix(&mbox(), "").replace("{ name = \"s.mbox\", text = ", "\"s.mbox\", { name = \"t\", text = ");
        assert!(refused(&path).contains("were not read"), "{}", refused(&path));
    }

    #[test]
    fn every_prefix_adds_a_check_that_comes_first_and_refuses_a_matrix_without_a_series() {
        let text = every_prefix(&matrix(&mbox(), "")).unwrap();
        let plan = parse(&text).unwrap();
        assert!(plan.matrix.workloads[0].get_ref().is_prefix_check());
        let first = &plan.cells[0];
        assert_eq!((first.workload.as_str(), first.variant.as_str()), (PREFIX_CHECK, "v@0"));
        assert_eq!(plan.cells.len(), 16, "4 prefixes x 2 values x 2 workloads");
        assert_eq!(parse(&plan.text).unwrap().cells, plan.cells, "the stored text has the check");
        let plain = "name = \"m\"\n[[image]]\nname = \"p\"\nkernel = \"probe\"\n";
        assert!(every_prefix(plain).unwrap_err().contains("no image with `series`"));
        assert!(every_prefix(&text).unwrap_err().contains("has one"));
    }

    #[test]
    fn long_names_are_cut_at_a_character() {
        let subject = "é".repeat(100);
        let plan = parse(&matrix(&patch(1, &subject, "a.c"), "")).unwrap();
        let name = &plan.matrix.variants[1].get_ref().name;
        assert!(name.len() <= MAX_NAME && name.starts_with("v@1-éé"), "{name}");
        let step = SeriesStep {
            index: 2,
            subject: "net: atlantic: use [PP] / XDP".into(),
            ..plan.cells[1].step.clone().unwrap()
        };
        assert_eq!(step.variant_name("v"), "v@2-net-atlantic-use-PP-XDP");
    }
}
