//! Bisections over the API: what makes no bisection is refused before anything is built or
//! queued, a series' files are texts (never the server's paths), and a plain run is no
//! bisection. A bisection end to end (QEMU) runs through a daemon in tests/atlantic_linux.rs.

use std::path::Path;

use crate::fixture::*;

#[test]
fn a_bisection_that_cannot_be_is_refused_with_the_reason_and_nothing_is_queued() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = Daemon::start(dir.path(), &[]);
    let client = daemon.client();
    let toml = [("content-type", "application/toml")];
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    let synthetic = std::fs::read_to_string(examples.join("atlantic-series-synthetic.toml")).unwrap();
    let sent = lab::recipe::inline_patches(&examples.join("atlantic-series-synthetic.toml"), &synthetic).unwrap();
    let refused = |query: &str, body: &str, status: u16, why: &str| {
        let answer = call(&client, "POST", &format!("/v1/bisects?{query}"), &toml, Some(body.as_bytes()));
        let text = String::from_utf8_lossy(&answer.body);
        assert_eq!(answer.status, status, "{query}: {text}");
        assert!(json_of(&answer)["message"].as_str().unwrap_or_default().contains(why), "{query}: {text}");
    };
    refused("metric=nope", &sent, 400, "metric \"nope\": give one of the report's");
    refused("metric=gbit_s&direction=sideways", &sent, 400, "give up, down or any");
    refused("budget=3", &sent, 400, "metric");
    refused("metric=gbit_s&budget=0", &sent, 422, "--budget 0");
    refused("metric=latency_p99_us", &sent, 422, "gives no latency_p99_us");
    let probe = std::fs::read_to_string(probe_matrix()).unwrap();
    refused("metric=maps_per_packet", &probe, 422, "a bisection needs an image with `series`");
    refused("metric=gbit_s", &synthetic, 422, "series[0]");
    let runs = json_of(&call(&client, "GET", "/v1/runs", &[], None));
    assert_eq!(runs.as_array().map(Vec::len), Some(0), "nothing was created: {runs}");
    let answer = call(&client, "GET", "/v1/bisects/20261205-000000-abcd", &[], None);
    assert_eq!(answer.status, 404, "{}", String::from_utf8_lossy(&answer.body));
}

#[test]
fn a_bisection_holds_its_budget_s_results_before_anything_is_built() {
    let test = "a_bisection_holds_its_budget_s_results_before_anything_is_built";
    if !crate::common::kvm_available(test) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let daemon = Daemon::start(dir.path(), &[]);
    let client = daemon.client();
    let toml = [("content-type", "application/toml")];
    // Two runs leave 30 of the daemon's 200,000 results: 100 x 1000 and 130 x 769.
    for (values, repetitions) in [(100, 1000), (130, 769)] {
        let values: Vec<String> = (0..values).map(|i| i.to_string()).collect();
        let big = format!(
            "name = \"big\"\nrepetitions = {repetitions}\n[[device]]\nname = \"aq\"\nmodel = \"aqc100\"\n\
             [[image]]\nname = \"probe\"\nkernel = \"probe\"\n[[variant]]\nname = \"v\"\nimage = \"probe\"\n\
             params = {{ \"m.p\" = [{}] }}\n[[workload]]\nname = \"rx\"\nkind = \"probe-rx\"\n",
            values.join(", ")
        );
        let answer = call(&client, "POST", "/v1/runs", &toml, Some(big.as_bytes()));
        assert_eq!(answer.status, 201, "{}", String::from_utf8_lossy(&answer.body));
    }
    // The synthetic series is 4 prefixes of 2 repetitions (8 results), but its bisection's run
    // has the budget's 10 of each: 40, refused before its images are built or its run made.
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    let file = examples.join("atlantic-series-synthetic.toml");
    let sent = lab::recipe::inline_patches(&file, &std::fs::read_to_string(&file).unwrap()).unwrap();
    let answer = call(&client, "POST", "/v1/bisects?metric=rx_maps_per_packet", &toml, Some(sent.as_bytes()));
    assert_eq!(answer.status, 429, "{}", String::from_utf8_lossy(&answer.body));
    assert!(json_of(&answer)["message"].as_str().unwrap().contains("this run has 40"), "{}", json_of(&answer));
    let runs = json_of(&call(&client, "GET", "/v1/runs", &[], None));
    assert_eq!(runs.as_array().map(Vec::len), Some(2), "no run was made for the bisection: {runs}");
}
