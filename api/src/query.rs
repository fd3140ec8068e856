//! Query strings: each route's parameters are a type axum's `Query` deserializes; a mistake is a
//! 400 problem whose message names the parameter and what it takes (serde's words).

use axum::extract::{FromRequestParts, Query};
use axum::http::request::Parts;
use serde::de::DeserializeOwned;

use crate::problem::Problem;

/// A route's query parameters, deserialized into `T`.
#[derive(Debug)]
pub struct Params<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for Params<T> {
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match Query::<T>::from_request_parts(parts, state).await {
            Ok(Query(params)) => Ok(Params(params)),
            Err(rejection) => Err(Problem::bad_request(rejection.body_text())),
        }
    }
}

/// `POST /v1/runs?skip_unrunnable=true&shard=K/N&fleet=ID`.
#[derive(Debug, Default, serde::Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct SubmitParams {
    /// record cells this host cannot run as SKIP instead of refusing the matrix
    #[serde(default)]
    pub skip_unrunnable: bool,
    /// run shard K of N of the matrix's repetitions (with `fleet`): this box's share of a fleet run
    #[serde(default)]
    #[param(value_type = Option<String>, example = "2/3")]
    pub shard: Option<lab::fleet::Shard>,
    /// the fleet run the shard belongs to, an ID the caller gives (letters, digits, `.`, `_`, `-`)
    #[serde(default)]
    #[param(value_type = Option<String>, example = "ci-8812-aqc100")]
    pub fleet: Option<lab::fleet::FleetId>,
}

impl SubmitParams {
    /// The fleet run and shard asked for: both or neither.
    pub fn share(&self) -> Result<Option<lab::fleet::FleetShard>, Problem> {
        match (&self.fleet, self.shard) {
            (Some(fleet), Some(shard)) => Ok(Some(lab::fleet::FleetShard { fleet: fleet.clone(), shard })),
            (None, None) => Ok(None),
            _ => Err(Problem::bad_request("give shard=K/N and fleet=ID together: a shard is of a fleet run")),
        }
    }
}

/// `POST /v1/bisects?metric=NAME&direction=up&threshold=PCT&budget=N`.
#[derive(Debug, Default, serde::Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct BisectParams {
    /// the figure, as the JSON report names it (`rx_maps_per_packet`, `gbit_s`, ...)
    pub metric: String,
    /// which way it must move to count: `up`, `down` or `any` [default: any]
    pub direction: Option<String>,
    /// a change smaller than this many percent is no change [default: 5]
    pub threshold: Option<f64>,
    /// most repetitions of one prefix [default: 10, or the matrix's repetitions if more]
    pub budget: Option<u32>,
}

/// `GET /v1/runs/{id}/report?baseline=VARIANT`.
#[derive(Debug, Default, serde::Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ReportParams {
    /// judge against this variant instead of the matrix's baseline
    pub baseline: Option<String>,
}

/// `GET /v1/runs?offset=N&limit=M`.
#[derive(Debug, Default, Clone, serde::Deserialize, serde::Serialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct RunsParams {
    /// runs to skip, newest first [default: 0]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub offset: Option<usize>,
    /// runs per page, 1 to 1000 [default: 100]; a `Link: <...>; rel="next"` header names the next page when there is one
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit: Option<usize>,
}

/// `GET /v1/vms/{id}/serial?follow=true`.
#[derive(Debug, Default, serde::Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct SerialParams {
    /// keep streaming until the VM ends
    #[serde(default)]
    pub follow: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::Request;

    async fn params<T: DeserializeOwned>(uri: &str) -> Result<T, Problem> {
        let (mut parts, ()) = Request::get(uri).body(()).unwrap().into_parts();
        Params::<T>::from_request_parts(&mut parts, &()).await.map(|Params(p)| p)
    }

    #[tokio::test]
    async fn flags_take_true_or_false_and_a_mistake_names_the_parameter() {
        assert!(params::<SubmitParams>("/v1/runs?skip_unrunnable=true").await.unwrap().skip_unrunnable);
        assert!(!params::<SubmitParams>("/v1/runs").await.unwrap().skip_unrunnable);
        let sharded = params::<SubmitParams>("/v1/runs?shard=2/3&fleet=ci-1").await.unwrap();
        assert_eq!(sharded.share().unwrap().unwrap().shard.to_string(), "2/3");
        assert!(params::<SubmitParams>("/v1/runs?shard=2/3").await.unwrap().share().is_err());
        for bad in ["/v1/runs?shard=0/3&fleet=a", "/v1/runs?shard=4/3&fleet=a", "/v1/runs?shard=1/3&fleet=../x"] {
            let refused = params::<SubmitParams>(bad).await.unwrap_err();
            assert_eq!(refused.status, axum::http::StatusCode::BAD_REQUEST, "{bad}");
            assert!(
                refused.message.contains("shard") || refused.message.contains("fleet"),
                "{bad}: {}",
                refused.message
            );
        }
        let e = params::<SerialParams>("/v1/vms/a/serial?follow=yes").await.unwrap_err();
        assert_eq!(e.status, axum::http::StatusCode::BAD_REQUEST);
        assert!(e.message.contains("follow"), "{}", e.message);
        let report = params::<ReportParams>("/v1/runs/r/report?baseline=pool").await.unwrap();
        assert_eq!(report.baseline.as_deref(), Some("pool"));
    }
}
