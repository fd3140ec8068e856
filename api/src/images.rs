//! Images over HTTP: the store's kernels, driver variants and initramfs, by ID, and builds
//! through the image commands. A request names images by ID and packages by name, never a path;
//! patches come in the request's body.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use guest_images::patches::PatchFile;
use guest_images::store::{ImageId, ImageKind};
use guest_images::{initramfs_build, kernel_image, module_build};

use crate::daemon::Daemon;
use crate::payload::Payload;
use crate::problem::{Problem, blocking};
use crate::types::{BuildInitramfs, BuildKernel, BuildModule, ImageSummary};

fn summary(id: ImageId, manifest: serde_json::Value) -> ImageSummary {
    ImageSummary { kind: id.kind(), id: id.to_string(), manifest }
}

fn lookup(daemon: &Daemon, id: &str) -> Result<ImageSummary, Problem> {
    let id: ImageId = id
        .parse()
        .map_err(|_| Problem::not_found(format!("{id:?} is not an image ID (kernel-…, module-…, initramfs-…)")))?;
    let manifest: serde_json::Value = daemon.images().manifest(id.as_str())?;
    Ok(summary(id, manifest))
}

/// `GET /v1/images`.
#[utoipa::path(get, path = "/v1/images", tag = "images",
    responses((status = 200, description = "Every image in the store", body = Vec<ImageSummary>)))]
pub async fn list(State(daemon): State<Arc<Daemon>>) -> Result<Json<Vec<ImageSummary>>, Problem> {
    blocking(move || {
        let images = daemon.images().list()?;
        Ok(Json(images.into_iter().filter_map(|(id, m)| Some(summary(id.parse().ok()?, m))).collect()))
    })
    .await
}

/// `GET /v1/images/{id}`.
#[utoipa::path(get, path = "/v1/images/{id}", tag = "images",
    params(("id" = String, Path, description = "The image")),
    responses(
        (status = 200, description = "The image and its manifest", body = ImageSummary),
        (status = 404, description = "No such image", body = crate::types::ErrorBody),
    ))]
pub async fn show(State(daemon): State<Arc<Daemon>>, Path(id): Path<String>) -> Result<Json<ImageSummary>, Problem> {
    blocking(move || lookup(&daemon, &id).map(Json)).await
}

/// Runs `build` as the only image build; busy if another runs.
fn one_build(daemon: &Daemon, build: impl FnOnce() -> Result<String, Problem>) -> Result<ImageSummary, Problem> {
    let _only =
        daemon.builds.try_lock().map_err(|_| Problem::busy("another image build is running; try again after it"))?;
    let id = build()?;
    lookup(daemon, &id)
}

fn created(result: Result<ImageSummary, Problem>) -> Response {
    match result {
        Ok(summary) => (StatusCode::CREATED, Json(summary)).into_response(),
        Err(p) => p.into_response(),
    }
}

/// `POST /v1/images/kernel`.
#[utoipa::path(post, path = "/v1/images/kernel", tag = "images", request_body(content = Option<BuildKernel>, description = "Optional: no body builds the default package"),
    responses(
        (status = 201, description = "The kernel image (the same package is the same image)", body = ImageSummary),
        (status = 400, description = "A malformed body", body = crate::types::ErrorBody),
        (status = 413, description = "The body is too large", body = crate::types::ErrorBody),
        (status = 415, description = "Not JSON", body = crate::types::ErrorBody),
        (status = 422, description = "Not a kernel package", body = crate::types::ErrorBody),
        (status = 429, description = "Another build is running", body = crate::types::ErrorBody),
        (status = 500, description = "The build failed (apt, the package)", body = crate::types::ErrorBody),
    ))]
pub async fn build_kernel(State(daemon): State<Arc<Daemon>>, payload: Payload) -> Response {
    let result = async {
        let request: BuildKernel = payload.json()?;
        if let Some(package) = &request.package {
            let ok = package.starts_with("linux-image-")
                && package.len() <= 100
                && package
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '.' | '+' | '-'));
            if !ok {
                return Err(Problem::unprocessable(format!("{package:?} is not a Debian linux-image-* package name")));
            }
        }
        blocking(move || {
            one_build(&daemon, || Ok(kernel_image::from_package(daemon.images(), request.package.as_deref())?.id))
        })
        .await
    }
    .await;
    created(result)
}

/// `POST /v1/images/module`.
#[utoipa::path(post, path = "/v1/images/module", tag = "images", request_body = BuildModule,
    responses(
        (status = 201, description = "The driver variant", body = ImageSummary),
        (status = 400, description = "A malformed body", body = crate::types::ErrorBody),
        (status = 404, description = "No such kernel image", body = crate::types::ErrorBody),
        (status = 413, description = "The body is too large", body = crate::types::ErrorBody),
        (status = 415, description = "Not JSON", body = crate::types::ErrorBody),
        (status = 422, description = "A patch that does not apply, a bad folder", body = crate::types::ErrorBody),
        (status = 429, description = "Another build is running", body = crate::types::ErrorBody),
        (status = 500, description = "The build failed", body = crate::types::ErrorBody),
    ))]
pub async fn build_module(State(daemon): State<Arc<Daemon>>, payload: Payload) -> Response {
    let result = async {
        let request: BuildModule = payload.json()?;
        if ImageId::of_kind(&request.kernel, ImageKind::Kernel).is_none() {
            return Err(Problem::unprocessable(format!("kernel {:?}: give a kernel image's ID", request.kernel)));
        }
        if let Some(only) = request
            .only
            .iter()
            .find(|o| o.is_empty() || !o.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-'))
        {
            return Err(Problem::unprocessable(format!("only {only:?}: a module's name")));
        }
        blocking(move || {
            one_build(&daemon, || {
                // The patches' texts, named in their order; no file is written or read.
                let patches = request
                    .patches
                    .iter()
                    .enumerate()
                    .map(|(i, text)| PatchFile { name: format!("{:03}.patch", i + 1), text: text.clone() })
                    .collect();
                let build = module_build::ModuleRequest {
                    driver: request.driver.clone().unwrap_or_else(|| module_build::DEFAULT_DRIVER_FOLDER.into()),
                    patches,
                    source: module_build::SourceSpec::default(),
                    kernel: request.kernel.clone(),
                    headers: None,
                    only: request.only.clone(),
                };
                Ok(module_build::build(daemon.images(), &build)?.id)
            })
        })
        .await
    }
    .await;
    created(result)
}

/// The programs a build asks for, each one this lab knows.
fn guest_tools(names: &[String]) -> Result<Vec<initramfs_build::GuestTool>, Problem> {
    names
        .iter()
        .map(|t| {
            t.parse::<initramfs_build::GuestTool>().map_err(|_| {
                let known: Vec<&str> = initramfs_build::GuestTool::ALL.iter().map(|t| t.program()).collect();
                Problem::unprocessable(format!("tools: {t:?} is none of {}", known.join(", ")))
            })
        })
        .collect()
}

/// `POST /v1/images/initramfs`.
#[utoipa::path(post, path = "/v1/images/initramfs", tag = "images", request_body = BuildInitramfs,
    responses(
        (status = 201, description = "The initramfs (the same inputs give the same image)", body = ImageSummary),
        (status = 400, description = "A malformed body", body = crate::types::ErrorBody),
        (status = 404, description = "No such kernel or module image", body = crate::types::ErrorBody),
        (status = 413, description = "The body is too large", body = crate::types::ErrorBody),
        (status = 415, description = "Not JSON", body = crate::types::ErrorBody),
        (status = 422, description = "Not image IDs, or a driver the kernel lacks", body = crate::types::ErrorBody),
        (status = 429, description = "Another build is running", body = crate::types::ErrorBody),
        (status = 500, description = "The build failed", body = crate::types::ErrorBody),
    ))]
pub async fn build_initramfs(State(daemon): State<Arc<Daemon>>, payload: Payload) -> Response {
    let result = async {
        let request: BuildInitramfs = payload.json()?;
        if ImageId::of_kind(&request.kernel, ImageKind::Kernel).is_none() {
            return Err(Problem::unprocessable(format!("kernel {:?}: give a kernel image's ID", request.kernel)));
        }
        if let Some(m) = request.modules.iter().find(|m| ImageId::of_kind(m, ImageKind::Module).is_none()) {
            return Err(Problem::unprocessable(format!("modules: {m:?} is not a module image's ID")));
        }
        if let Some(d) = request
            .drivers
            .iter()
            .find(|d| d.is_empty() || !d.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-'))
        {
            return Err(Problem::unprocessable(format!("drivers: {d:?} is not a module's name")));
        }
        let tools = guest_tools(&request.tools)?;
        blocking(move || {
            one_build(&daemon, || {
                let build = initramfs_build::InitramfsRequest {
                    kernel: request.kernel.clone(),
                    modules: request.modules.clone(),
                    drivers: request.drivers.clone(),
                    tools: tools.clone(),
                };
                Ok(initramfs_build::build(daemon.images(), &build)?.id)
            })
        })
        .await
    }
    .await;
    created(result)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_image_ids_name_images() {
        for id in ["kernel-b4ecf741a5956628", "module-4a80c97f554ad821", "initramfs-e2d146713e02418b"] {
            assert!(id.parse::<ImageId>().is_ok(), "{id}");
        }
        for id in ["../etc", "kernel-", "kernel-../x", "kernel-b4ec/../../x", "probe", "kernel-xyz", ".scratch"] {
            assert!(id.parse::<ImageId>().is_err(), "{id}");
        }
    }

    #[test]
    fn an_initramfs_build_takes_the_tools_this_lab_knows() {
        let names = |list: &[&str]| list.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(guest_tools(&names(&["sockperf"])).unwrap(), [initramfs_build::GuestTool::Sockperf]);
        assert!(guest_tools(&[]).unwrap().is_empty());
        let refused = guest_tools(&names(&["sockperf", "../bin/sh"])).unwrap_err();
        assert_eq!(
            (refused.status, refused.message.as_str()),
            (StatusCode::UNPROCESSABLE_ENTITY, "tools: \"../bin/sh\" is none of sockperf, xdp-bench, kselftest")
        );
    }
}
