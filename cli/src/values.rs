//! The values of the library's enums on the command line (engine profiles, pools, purge
//! policies, KV types, budget modes), parsed from the library's own tables (`ALL`, `name`,
//! `parse`) rather than mirrored here: a variant added there is accepted, listed in `--help`
//! and named in the errors without a change to the CLI.

use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
use cupool::kernels::KvType;
use cupool::pool::{PoolKind, PurgePolicy};
use cupool::runtime::planner::weights::WeightType;
use cupool::runtime::profile::{EngineKind, EngineModel, Profile, Weights};
use cupool::runtime::BudgetMode;

/// `--engine`: cupool's runtime, whose traffic is its own, or an engine profile.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Engine {
    /// cupool's runtime.
    Cupool,
    /// A real engine's profile.
    Profile(Profile),
}

impl Engine {
    /// The engine profile, if it is one.
    pub fn profile(self) -> Option<Profile> {
        match self {
            Self::Cupool => None,
            Self::Profile(p) => Some(p),
        }
    }
}

/// A parser of the values of a library table: clap matches, lists and suggests `values`; the
/// library's `parse` makes the value.
fn table<T: Clone + Send + Sync + 'static>(
    what: &'static str,
    values: impl IntoIterator<Item = PossibleValue>,
    parse: fn(&str) -> Option<T>,
) -> impl TypedValueParser<Value = T> {
    let values: Vec<PossibleValue> = values.into_iter().collect();
    let accepted = values
        .iter()
        .map(|v| v.get_name())
        .collect::<Vec<_>>()
        .join(", ");
    PossibleValuesParser::new(values).try_map(move |s| {
        parse(&s).ok_or_else(|| format!("unknown {what} {s:?}: accepted are {accepted}"))
    })
}

/// The `--pool` values: every kind of the pool crate's table.
pub fn pool_kind() -> impl TypedValueParser<Value = PoolKind> {
    let values = PoolKind::ALL.iter().map(|k| PossibleValue::new(k.name()));
    table("pool", values, PoolKind::parse)
}

/// The `--purge` values: every policy.
pub fn purge() -> impl TypedValueParser<Value = PurgePolicy> {
    let values = PurgePolicy::ALL.map(|p| PossibleValue::new(p.name()));
    table("purge policy", values, PurgePolicy::parse)
}

/// The `--kv-type` values: every KV cache type.
pub fn kv_type() -> impl TypedValueParser<Value = KvType> {
    let values = KvType::ALL.map(|k| PossibleValue::new(k.name()));
    table("KV type", values, KvType::parse)
}

/// The `--budget` values: every budget mode.
pub fn budget() -> impl TypedValueParser<Value = BudgetMode> {
    let values = BudgetMode::ALL.map(|b| PossibleValue::new(b.name()));
    table("budget mode", values, BudgetMode::parse)
}

/// An engine profile's name on the command line: the profile's own, spelt with hyphens
/// (`ik-llama`).
pub fn engine_name(p: Profile) -> String {
    p.name().replace('_', "-")
}

/// An engine profile as a value of `--engine`: its [`engine_name`], with the underscore
/// spelling (`ik_llama`, `llama_b8833`) as an alias.
fn profile_value(p: Profile) -> PossibleValue {
    let name = engine_name(p);
    let alias = p.name().replace('-', "_");
    let value = PossibleValue::new(&name).help(engine_help(p));
    if alias == name {
        value
    } else {
        value.alias(alias)
    }
}

/// The `--engine` values of `run` and `plan`: cupool's runtime, then every engine profile.
pub fn engine() -> impl TypedValueParser<Value = Engine> {
    let cupool = EngineKind::Cupool.name();
    let values = std::iter::once(PossibleValue::new(cupool).help(OWN_ENGINE_HELP))
        .chain(Profile::ALL.map(profile_value));
    table("engine", values, |s| {
        if s == EngineKind::Cupool.name() {
            Some(Engine::Cupool)
        } else {
            Profile::parse(s).map(Engine::Profile)
        }
    })
}

/// The `--engine` values of `predict`: the engine profiles alone (cupool's own traffic is
/// what `run` measures, so `predict` neither lists nor accepts `cupool`).
pub fn engine_profile() -> impl TypedValueParser<Value = Profile> {
    table(
        "engine profile",
        Profile::ALL.map(profile_value),
        Profile::parse,
    )
}

/// `--weight-type`: the type given (any of ggml's types in [`WeightType`]'s table: its size
/// gives the weights' bytes, and float types take the cuBLAS path, quantized ones MMQ), else the
/// default: f16, but q8_0 for a mixture-of-experts preset under an engine profile, since no
/// profile models f16 experts (one call per expert, sized by the routing). A float type given
/// for such a preset is refused, naming the type that works.
pub fn weight_type(
    given: Option<&str>,
    model: &str,
    profile: Option<Profile>,
) -> Result<WeightType, String> {
    let moe = EngineModel::preset(model).is_some_and(|m| m.moe.is_some());
    let named = |n: &str| WeightType::parse(n).expect("a type of the table");
    let Some(s) = given else {
        return Ok(match (moe, profile) {
            (true, Some(_)) => named("q8_0"),
            _ => named("f16"),
        });
    };
    let w = WeightType::parse(s)
        .ok_or_else(|| format!("--weight-type {s:?}: accepted are {}", WeightType::names()))?;
    match profile {
        Some(p) if moe && w.path() == Weights::F16 => Err(format!(
            "--weight-type {s}: {model} is a mixture-of-experts model and the {} profile does not model float experts (one call per expert, sized by the routing): accepted is a quantized type, such as --weight-type q8_0, its default for {model}",
            engine_name(p)
        )),
        _ => Ok(w),
    }
}

/// `--cc MAJOR.MINOR` as the profiles count it (900 for 9.0), or what is wrong with it.
pub fn cc(s: &str) -> Result<u32, String> {
    s.split_once('.')
        .and_then(|(ma, mi)| {
            let (ma, mi) = (ma.parse::<u32>().ok()?, mi.parse::<u32>().ok()?);
            (ma <= 99 && mi <= 9).then_some(ma * 100 + mi * 10)
        })
        .ok_or_else(|| format!("--cc {s:?}: accepted is MAJOR.MINOR, e.g. 9.0"))
}

/// `--engine cupool` in `--help`.
const OWN_ENGINE_HELP: &str =
    "cupool's runtime: the flash-attention scratch and the GEMM workspace";

/// An engine profile in `--help` (a new profile needs its line: the match is exhaustive).
fn engine_help(p: Profile) -> &'static str {
    match p {
        Profile::IkLlama => "ik_llama.cpp 8337e4cd: every op's requests (dense presets)",
        Profile::LlamaB8833 => "llama.cpp before PR #23907 (b8833): K/V f16 copies from the pool",
        Profile::Llama => {
            "llama.cpp after PR #23907 (ggml d99724f2): K/V f16 copies in the compute buffer"
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{Cli, Command, PredictArgs, ReplayArgs, RunArgs};
    use clap::Parser;

    fn cli(args: &[&str]) -> Cli {
        let argv = std::iter::once("repro-prefill").chain(args.iter().copied());
        Cli::try_parse_from(argv).unwrap_or_else(|e| panic!("{args:?}: {e}"))
    }

    fn run(args: &[&str]) -> RunArgs {
        match cli(&[&["run"], args].concat()).command {
            Some(Command::Run(a)) => a,
            c => panic!("{c:?}"),
        }
    }

    fn plan(args: &[&str]) -> RunArgs {
        match cli(&[&["plan"], args].concat()).command {
            Some(Command::Plan(a)) => a,
            c => panic!("{c:?}"),
        }
    }

    fn replay(args: &[&str]) -> ReplayArgs {
        match cli(&[&["replay", "t.jsonl"], args].concat()).command {
            Some(Command::Replay(a)) => a,
            c => panic!("{c:?}"),
        }
    }

    fn predict(args: &[&str]) -> PredictArgs {
        match cli(&[&["predict"], args].concat()).command {
            Some(Command::Predict(a)) => a,
            c => panic!("{c:?}"),
        }
    }

    #[test]
    fn every_engine_profile_is_accepted_in_each_spelling() {
        for p in Profile::ALL {
            let spellings = [engine_name(p), p.name().into(), p.name().replace('-', "_")];
            for s in &spellings {
                let want = Engine::Profile(p);
                assert_eq!(run(&["--engine", s]).engine, want, "run --engine {s}");
                assert_eq!(plan(&["--engine", s]).engine, want, "plan --engine {s}");
                assert_eq!(predict(&["--engine", s]).engine, p, "predict --engine {s}");
            }
        }
        assert_eq!(run(&["--engine", "cupool"]).engine, Engine::Cupool);
        assert_eq!(run(&[]).engine, Engine::Cupool);
        assert_eq!(predict(&[]).engine, Profile::IkLlama);
        // cupool's runtime, then the profiles, each once; predict lists the profiles alone.
        assert_eq!(
            engine().possible_values().unwrap().count(),
            Profile::ALL.len() + 1
        );
        let listed: Vec<String> = engine_profile()
            .possible_values()
            .unwrap()
            .map(|v| v.get_name().to_string())
            .collect();
        assert_eq!(listed, Profile::ALL.map(engine_name));
    }

    #[test]
    fn every_pool_purge_policy_kv_type_and_budget_mode_is_accepted() {
        for k in PoolKind::ALL.iter().copied() {
            let s = k.name();
            assert_eq!(run(&["--pool", s]).pool, Some(k), "run --pool {s}");
            assert_eq!(plan(&["--pool", s]).pool, Some(k), "plan --pool {s}");
            assert_eq!(replay(&["--pool", s]).pool, k, "replay --pool {s}");
            assert_eq!(predict(&["--pool", s]).pool, k, "predict --pool {s}");
            let upper = s.to_ascii_uppercase();
            assert_eq!(run(&["--pool", &upper]).pool, Some(k), "--pool {upper}");
        }
        for p in PurgePolicy::ALL {
            let s = p.name();
            assert_eq!(run(&["--purge", s]).purge, p, "run --purge {s}");
            assert_eq!(plan(&["--purge", s]).purge, p, "plan --purge {s}");
            assert_eq!(replay(&["--purge", s]).purge, p, "replay --purge {s}");
            assert_eq!(predict(&["--purge", s]).purge, p, "predict --purge {s}");
        }
        for k in KvType::ALL {
            let s = k.name();
            assert_eq!(run(&["--kv-type", s]).kv_type, k, "run --kv-type {s}");
            assert_eq!(
                predict(&["--kv-type", s]).kv_type,
                k,
                "predict --kv-type {s}"
            );
        }
        for b in BudgetMode::ALL {
            let s = b.name();
            assert_eq!(run(&["--budget", s]).budget, b, "run --budget {s}");
        }
        // The tables' listings agree with their lists.
        let names = |n: &[&str]| n.join(", ");
        assert_eq!(
            names(&PurgePolicy::ALL.map(PurgePolicy::name)),
            PurgePolicy::NAMES
        );
        assert_eq!(
            names(&BudgetMode::ALL.map(BudgetMode::name)),
            BudgetMode::NAMES
        );
    }

    #[test]
    fn the_default_weight_type_is_one_the_model_s_profile_accepts() {
        for p in Profile::ALL {
            for model in EngineModel::PRESETS {
                let moe = EngineModel::preset(model).unwrap().moe.is_some();
                let default = weight_type(None, model, Some(p)).unwrap();
                assert_eq!(default.path() == Weights::Q8_0, moe, "{model} under {p:?}");
                // The default is what the user would have had to give.
                assert_eq!(weight_type(Some(default.name), model, Some(p)), Ok(default));
                for float in ["f16", "bf16", "f32"] {
                    let w = weight_type(Some(float), model, Some(p));
                    if moe {
                        let e = w.unwrap_err();
                        assert!(e.contains("--weight-type q8_0"), "{e}");
                    } else {
                        assert_eq!(w.map(|w| w.path()), Ok(Weights::F16));
                    }
                }
                let q4 = weight_type(Some("q4_0"), model, Some(p)).unwrap();
                assert_eq!(q4.path(), Weights::Q8_0);
            }
        }
        // cupool's own runtime keeps f16 for every preset.
        for model in EngineModel::PRESETS {
            assert_eq!(weight_type(None, model, None).map(|w| w.name), Ok("f16"));
        }
        let e = weight_type(Some("q3_k"), "phi3-mini", None).unwrap_err();
        assert!(e.contains("f32, f16, bf16, q8_0"), "{e}");
    }

    #[test]
    fn values_outside_the_tables_are_refused() {
        for args in [
            &["run", "--engine", "vllm"][..],
            &["run", "--engine", "IK-LLAMA"],
            &["predict", "--engine", "cupool"],
            &["predict", "--purge", "NEVER"],
            &["run", "--kv-type", "q4_0"],
            &["run", "--budget", "plan"],
            &["replay", "t.jsonl", "--pool", "bogus"],
        ] {
            let argv = std::iter::once("repro-prefill").chain(args.iter().copied());
            let e = Cli::try_parse_from(argv).expect_err(&format!("{args:?}"));
            assert_eq!(e.kind(), clap::error::ErrorKind::InvalidValue, "{args:?}");
        }
    }
}
