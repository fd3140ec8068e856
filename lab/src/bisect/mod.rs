//! Bisection of a patch series by a measured figure: which patch first moves a metric (or first
//! breaks the cell) against the series' base. Each step measures one prefix and judges it
//! against the base with the lab's rule ([`VerdictRule`]: a change beyond the threshold, Welch's
//! p below alpha and, below ten samples a side, ranges that do not overlap). Where the rule
//! cannot tell (a noisy step), both sides get more repetitions, up to the budget; past it the
//! bisection says it is undecided rather than guess. A prefix that fails (an oops, a hang, a
//! check, a BUILD-FAIL) is a broken step: a change, the first patch that breaks the cell.
//!
//! The search here knows prefixes only through a [`Prober`]: [`run`] gives it one that runs
//! repetitions in a stored run; the tests give it figures drawn from distributions.

pub mod run;

use serde::{Deserialize, Serialize};

use crate::metric::Metric;
use crate::stats::{Change, Moments, Verdict, VerdictRule};

/// What counts as a change.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, strum::Display, strum::EnumString)]
#[serde(rename_all = "lowercase")]
#[strum(serialize_all = "lowercase")]
pub enum Direction {
    /// Either way.
    #[default]
    Any,
    /// The figure going up.
    Up,
    /// The figure going down.
    Down,
}

/// What a bisection looks for and may spend.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Goal {
    /// The figure.
    pub metric: Metric,
    /// Which way it must move.
    pub direction: Direction,
    /// The rule a change is judged by (its threshold in percent included).
    pub rule: VerdictRule,
    /// Repetitions a prefix starts with.
    pub repetitions: u32,
    /// Most repetitions of one prefix.
    pub budget: u32,
}

/// What the prober knows of a prefix after running it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Measured {
    /// The figure of each passing repetition so far.
    pub values: Vec<f64>,
    /// Repetitions run so far (passing or not).
    pub runs: u32,
    /// Why it broke, when a repetition failed (FAIL, BUILD-FAIL).
    pub broken: Option<String>,
}

/// Runs repetitions of a series' prefixes.
pub trait Prober {
    /// Why it could not (the lab failed, the bisection was cancelled).
    type Error;
    /// Runs `more` repetitions of prefix `prefix` (0: the base) and gives all it has of it.
    fn probe(&mut self, prefix: usize, more: u32) -> Result<Measured, Self::Error>;
}

/// A step's verdict.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "verdict", rename_all = "lowercase")]
pub enum StepVerdict {
    /// The figure is where the base's is.
    Same,
    /// The figure moved (as asked).
    Changed,
    /// The cell failed: the reason.
    Broken {
        /// Why.
        why: String,
    },
    /// The rule could not tell within the budget.
    Undecided,
}

impl StepVerdict {
    /// Its name: `same`, `changed`, `broken`, `undecided`.
    pub fn word(&self) -> &'static str {
        match self {
            StepVerdict::Same => "same",
            StepVerdict::Changed => "changed",
            StepVerdict::Broken { .. } => "broken",
            StepVerdict::Undecided => "undecided",
        }
    }
}

/// One step of a bisection: a prefix judged against the base.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Step {
    /// The prefix: patches applied.
    pub prefix: usize,
    /// Its verdict.
    #[serde(flatten)]
    pub verdict: StepVerdict,
    /// Its figures.
    pub figures: Option<Moments>,
    /// The base's figures it was judged against.
    pub base: Option<Moments>,
    /// The change against the base.
    pub change: Option<Change>,
    /// Repetitions it ran.
    pub runs: u32,
}

/// How a bisection ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "kebab-case")]
pub enum Outcome {
    /// Patch `patch` (1-based) is the first that moves the figure or breaks the cell.
    FirstChange {
        /// The patch.
        patch: usize,
        /// The prefix before it, measured (its figures).
        before: Option<Moments>,
        /// The prefix it ends, measured.
        after: Option<Moments>,
        /// Why the cell broke there, when it did.
        broken: Option<String>,
    },
    /// The whole series leaves the figure where the base has it.
    NoChange,
    /// The change lies between prefixes `from` and `to` and the budget did not tell where.
    Undecided {
        /// The last prefix known to be like the base.
        from: usize,
        /// The first known to differ (or the last patch).
        to: usize,
    },
    /// The base itself fails: nothing to bisect against.
    BaseBroken {
        /// Why.
        why: String,
    },
}

/// A finished bisection: its steps, in the order they ran, and its outcome.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Bisection {
    /// The figure.
    pub metric: Metric,
    /// Patches in the series.
    pub patches: usize,
    /// The steps.
    pub steps: Vec<Step>,
    /// How it ended.
    pub outcome: Outcome,
}

/// Bisects a series of `patches` patches for `goal` with `prober`, telling each step to
/// `on_step` as it is judged.
pub fn bisect<P: Prober>(
    patches: usize,
    goal: &Goal,
    prober: &mut P,
    on_step: &mut dyn FnMut(&Step),
) -> Result<Bisection, P::Error> {
    let mut steps = Vec::new();
    let mut judge = Judge { goal, prober, base: Measured::default() };
    judge.base = judge.prober.probe(0, goal.repetitions)?;
    if let Some(why) = judge.base.broken.clone() {
        return Ok(Bisection { metric: goal.metric, patches, steps, outcome: Outcome::BaseBroken { why } });
    }
    let mut record = |step: Step, steps: &mut Vec<Step>| {
        on_step(&step);
        let verdict = step.verdict.clone();
        steps.push(step);
        verdict
    };
    let last = judge.step(patches)?;
    match record(last, &mut steps) {
        StepVerdict::Same => return Ok(Bisection { metric: goal.metric, patches, steps, outcome: Outcome::NoChange }),
        StepVerdict::Undecided => {
            return Ok(Bisection {
                metric: goal.metric,
                patches,
                steps,
                outcome: Outcome::Undecided { from: 0, to: patches },
            });
        }
        StepVerdict::Changed | StepVerdict::Broken { .. } => {}
    }
    let (mut same, mut changed) = (0, patches);
    while changed - same > 1 {
        let mid = same + (changed - same) / 2;
        let step = judge.step(mid)?;
        match record(step, &mut steps) {
            StepVerdict::Same => same = mid,
            StepVerdict::Changed | StepVerdict::Broken { .. } => changed = mid,
            StepVerdict::Undecided => {
                return Ok(Bisection {
                    metric: goal.metric,
                    patches,
                    steps,
                    outcome: Outcome::Undecided { from: same, to: changed },
                });
            }
        }
    }
    let figures = |prefix: usize| match prefix {
        0 => Moments::of(&judge.base.values),
        k => steps.iter().rev().find(|s| s.prefix == k).and_then(|s| s.figures),
    };
    let broken = steps.iter().rev().find(|s| s.prefix == changed).and_then(|s| match &s.verdict {
        StepVerdict::Broken { why } => Some(why.clone()),
        _ => None,
    });
    let outcome = Outcome::FirstChange { patch: changed, before: figures(same), after: figures(changed), broken };
    Ok(Bisection { metric: goal.metric, patches, steps, outcome })
}

/// Judges prefixes against the base, adding repetitions where the rule cannot tell.
struct Judge<'a, P> {
    goal: &'a Goal,
    prober: &'a mut P,
    base: Measured,
}

impl<P: Prober> Judge<'_, P> {
    /// Measures `prefix` and judges it against the base, up to the budget.
    fn step(&mut self, prefix: usize) -> Result<Step, P::Error> {
        let goal = self.goal;
        let mut measured = self.prober.probe(prefix, goal.repetitions)?;
        loop {
            let change = goal.rule.judge(&self.base.values, &measured.values, goal.metric.higher_is_better());
            let figures = Moments::of(&measured.values);
            let base = Moments::of(&self.base.values);
            let verdict = match (&measured.broken, change.map(|c| c.verdict)) {
                (Some(why), _) => StepVerdict::Broken { why: why.clone() },
                (None, Some(Verdict::Same)) => StepVerdict::Same,
                (None, Some(Verdict::Better | Verdict::Worse)) => self.as_asked(figures, base),
                (None, Some(Verdict::Noisy | Verdict::Baseline) | None) => StepVerdict::Undecided,
            };
            let room = measured.runs < goal.budget || self.base.runs < goal.budget;
            if verdict != StepVerdict::Undecided || !room {
                return Ok(Step { prefix, verdict, figures, base, change, runs: measured.runs });
            }
            // Both sides grow together: Welch's test and the ranges' rule both want samples.
            let more = |runs: u32| goal.repetitions.min(goal.budget.saturating_sub(runs));
            if self.base.runs < goal.budget {
                self.base = self.prober.probe(0, more(self.base.runs))?;
            }
            if measured.runs < goal.budget {
                measured = self.prober.probe(prefix, more(measured.runs))?;
            }
        }
    }

    /// A real change, counted when it goes the way the goal asks.
    fn as_asked(&self, figures: Option<Moments>, base: Option<Moments>) -> StepVerdict {
        let up = figures.zip(base).is_some_and(|(f, b)| f.mean > b.mean);
        match (self.goal.direction, up) {
            (Direction::Any, _) | (Direction::Up, true) | (Direction::Down, false) => StepVerdict::Changed,
            _ => StepVerdict::Same,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    /// Normal samples, reproducible: xorshift64* and Box-Muller.
    struct Normals(u64);

    impl Normals {
        fn uniform(&mut self) -> f64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            ((self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 + 0.5) / (1u64 << 53) as f64
        }

        fn sample(&mut self, mean: f64, spread: f64) -> f64 {
            let (u, v) = (self.uniform(), self.uniform());
            mean + spread * (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
        }
    }

    /// A lab whose prefixes give figures from normal distributions, or break.
    struct FakeLab {
        /// Each prefix's mean and spread; a prefix past the list is like the last.
        means: Vec<(f64, f64)>,
        broken: BTreeMap<usize, String>,
        rng: Normals,
        seen: BTreeMap<usize, Measured>,
        probes: Vec<(usize, u32)>,
        /// Figures at the mean plus and minus the spread in turn, rather than drawn.
        alternating: bool,
    }

    impl FakeLab {
        fn new(means: &[(f64, f64)]) -> FakeLab {
            FakeLab {
                means: means.to_vec(),
                broken: BTreeMap::new(),
                rng: Normals(0x9e37_79b9_7f4a_7c15),
                seen: BTreeMap::new(),
                probes: Vec::new(),
                alternating: false,
            }
        }
    }

    impl Prober for FakeLab {
        type Error = std::convert::Infallible;

        fn probe(&mut self, prefix: usize, more: u32) -> Result<Measured, Self::Error> {
            self.probes.push((prefix, more));
            let (mean, spread) = self.means[prefix.min(self.means.len() - 1)];
            let seen = self.seen.entry(prefix).or_default();
            for _ in 0..more {
                seen.runs += 1;
                match self.broken.get(&prefix) {
                    Some(why) => seen.broken = Some(why.clone()),
                    None if self.alternating => {
                        seen.values.push(if seen.runs % 2 == 0 { mean - spread } else { mean + spread });
                    }
                    None => seen.values.push(self.rng.sample(mean, spread)),
                }
            }
            Ok(seen.clone())
        }
    }

    fn goal(budget: u32) -> Goal {
        Goal {
            metric: Metric::RxMapsPerPacket,
            direction: Direction::Any,
            rule: VerdictRule::default(),
            repetitions: 3,
            budget,
        }
    }

    fn run(lab: &mut FakeLab, patches: usize, goal: &Goal) -> Bisection {
        let mut told = Vec::new();
        let Ok(bisection) = bisect(patches, goal, lab, &mut |s| told.push(s.prefix));
        assert_eq!(told, bisection.steps.iter().map(|s| s.prefix).collect::<Vec<_>>(), "each step told once");
        bisection
    }

    #[test]
    fn a_step_change_is_found_at_its_patch() {
        // RX maps per packet: 0.5 until patch 5 of 8, then 0.0625; little noise.
        let means = [(0.5, 0.002), (0.5, 0.002), (0.5, 0.002), (0.5, 0.002), (0.5, 0.002), (0.0625, 0.001)];
        let mut lab = FakeLab::new(&means);
        let b = run(&mut lab, 8, &goal(12));
        let Outcome::FirstChange { patch, before, after, broken } = &b.outcome else { panic!("{b:?}") };
        assert_eq!((*patch, broken), (5, &None));
        let (before, after) = (before.unwrap(), after.unwrap());
        assert!((before.mean - 0.5).abs() < 0.01 && (after.mean - 0.0625).abs() < 0.01, "{before:?} {after:?}");
        assert!(b.steps.len() <= 4, "log2(8) steps after the last one: {:?}", b.steps);
        assert_eq!(b.steps[0].prefix, 8, "the whole series first");
    }

    #[test]
    fn overlapping_figures_get_repetitions_up_to_the_budget_then_the_bisection_says_so() {
        // A 10 % shift under 20 % noise, the ranges always overlapping: the rule cannot separate
        // them however many samples the budget allows.
        let mut lab = FakeLab::new(&[(1.0, 0.2), (1.1, 0.2)]);
        lab.alternating = true;
        let b = run(&mut lab, 4, &goal(9));
        assert_eq!(b.outcome, Outcome::Undecided { from: 0, to: 4 });
        let runs = |p: usize| lab.seen[&p].runs;
        assert_eq!((runs(0), runs(4)), (9, 9), "both sides grew to the budget and no further: {:?}", lab.probes);
        assert!(lab.probes.iter().all(|&(_, more)| more <= 3), "{:?}", lab.probes);
        // The same figures with no shift at all: the same, the whole series.
        let mut flat = FakeLab::new(&[(1.0, 0.001)]);
        assert_eq!(run(&mut flat, 4, &goal(9)).outcome, Outcome::NoChange);
    }

    #[test]
    fn a_crashing_step_is_that_step_s_verdict_and_the_bisection_ends() {
        // Patch 3 of 6 oopses on load; 4 to 6 carry it.
        let mut lab = FakeLab::new(&[(9.0, 0.05)]);
        for p in 3..=6 {
            lab.broken.insert(p, "oops: BUG: kernel NULL pointer dereference".into());
        }
        let mut goal = goal(6);
        goal.metric = Metric::GbitS;
        let b = run(&mut lab, 6, &goal);
        let Outcome::FirstChange { patch, broken, .. } = &b.outcome else { panic!("{b:?}") };
        assert_eq!((*patch, broken.as_deref()), (3, Some("oops: BUG: kernel NULL pointer dereference")));
        assert!(b.steps.iter().any(|s| matches!(s.verdict, StepVerdict::Broken { .. })));
        // A base that fails has nothing to be judged against.
        let mut base = FakeLab::new(&[(9.0, 0.05)]);
        base.broken.insert(0, "BUILD-FAIL: error".into());
        assert!(matches!(run(&mut base, 2, &goal).outcome, Outcome::BaseBroken { .. }));
    }

    #[test]
    fn a_change_the_wrong_way_is_no_change_when_a_direction_is_asked() {
        let mut lab = FakeLab::new(&[(9.0, 0.05), (9.0, 0.05), (4.0, 0.05)]);
        let mut goal = goal(6);
        goal.metric = Metric::GbitS;
        goal.direction = Direction::Up;
        assert_eq!(run(&mut lab, 3, &goal).outcome, Outcome::NoChange);
        goal.direction = Direction::Down;
        let mut lab = FakeLab::new(&[(9.0, 0.05), (9.0, 0.05), (4.0, 0.05)]);
        assert!(matches!(run(&mut lab, 3, &goal).outcome, Outcome::FirstChange { patch: 2, .. }));
    }
}
