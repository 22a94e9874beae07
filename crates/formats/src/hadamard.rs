//! `prism.hadamard.*`: the blockwise Hadamard rotation a PrismML pack folds into its weights.
//!
//! A folded weight stores `W' = W·Rᵀ` with `R = H·S / √1024` applied block by block along the
//! input (`K`) axis: `S` is a ±1 sign per input position and `H` the natural-order (Sylvester)
//! 1024-point Walsh–Hadamard matrix on each consecutive 1024-wide block. The runtime computes
//! `W'·(R·x)`: flip the signs of `x`, transform each 1024-block, divide by 32. The embedding table
//! is the one tensor stored rotated the other way (`inverse_weight_names`): a gathered row `z`
//! becomes `S·(H·z / 32)`.
//!
//! The keys, all required except `gdn_v_grouped` (false when absent):
//!
//! | key | meaning |
//! |-----|---------|
//! | `version` | 1 |
//! | `block_size` | 1024 |
//! | `transform` | `normalized-sylvester-walsh-hadamard` |
//! | `axis` | `input-last-dimension` |
//! | `sign_mode` | `explicit` |
//! | `sign_widths` | the input widths that have a sign vector, e.g. `[5120, 6144, 17408]` |
//! | `sign_values` | the vectors, concatenated in `sign_widths` order, every entry ±1 |
//! | `weight_names` | the folded tensors |
//! | `inverse_weight_names` | the tensors stored inverse-rotated (the embedding) |
//! | `gdn_v_grouped` | `ssm_out`'s input columns stay in grouped value-head order |
//!
//! Integers may be stored with any integer type and the signs as any integer or float array;
//! anything else is refused naming the key, since a wrong rotation still runs and produces fluent
//! text from a different model.

use std::collections::{BTreeMap, BTreeSet};

use crate::gguf::{Gguf, GgufError, GgufValue};

/// The key prefix of the rotation metadata.
pub const HADAMARD_PREFIX: &str = "prism.hadamard.";
/// The one transform name version 1 defines.
pub const HADAMARD_TRANSFORM: &str = "normalized-sylvester-walsh-hadamard";
/// The one axis name version 1 defines.
pub const HADAMARD_AXIS: &str = "input-last-dimension";
/// The rotation's block length.
pub const HADAMARD_BLOCK: usize = 1024;

/// The keys version 1 defines (after [`HADAMARD_PREFIX`]).
pub const HADAMARD_KEYS: [&str; 10] = [
    "version",
    "block_size",
    "transform",
    "axis",
    "sign_mode",
    "sign_widths",
    "sign_values",
    "weight_names",
    "inverse_weight_names",
    "gdn_v_grouped",
];

/// The sign vectors of a rotation declaration: `values` holds each width's ±1 signs back to back,
/// in the order of `widths` (checked positive, distinct multiples of [`HADAMARD_BLOCK`]). The error
/// says what is wrong with `sign_values`.
pub fn split_signs(widths: &[usize], values: &[f64]) -> Result<Vec<(usize, Vec<f32>)>, String> {
    let total: usize = widths.iter().sum();
    if values.len() != total {
        return Err(format!(
            "holds {} values but sign_widths {widths:?} add up to {total}",
            values.len()
        ));
    }
    if let Some((i, v)) = values
        .iter()
        .enumerate()
        .find(|(_, &v)| v != 1.0 && v != -1.0)
    {
        return Err(format!("entry {i} is {v}, not +1 or -1"));
    }
    let mut at = 0;
    Ok(widths
        .iter()
        .map(|&w| {
            let signs = values[at..at + w].iter().map(|&v| v as f32).collect();
            at += w;
            (w, signs)
        })
        .collect())
}

/// The validated rotation metadata of a GGUF file.
#[derive(Clone, Debug, PartialEq)]
pub struct HadamardMeta {
    /// The sign vector (±1.0) of each input width.
    pub signs: BTreeMap<usize, Vec<f32>>,
    /// Tensors folded as `W·Rᵀ` (their activation is rotated before the matmul).
    pub weight_names: BTreeSet<String>,
    /// Tensors stored rotated by `R` per row (the embedding: un-rotated after the gather).
    pub inverse_weight_names: BTreeSet<String>,
    /// `ssm_out`'s input columns are in grouped value-head order (see docs/formats.md).
    pub gdn_v_grouped: bool,
}

impl HadamardMeta {
    /// The rotation metadata of `file`: `None` when it has no `prism.hadamard.*` keys, an error
    /// naming the key when they are present but not a valid version-1 declaration.
    pub fn from_gguf(file: &Gguf) -> Result<Option<HadamardMeta>, GgufError> {
        let present: Vec<&str> = file
            .metadata()
            .iter()
            .filter_map(|(k, _)| k.strip_prefix(HADAMARD_PREFIX))
            .collect();
        if present.is_empty() {
            return Ok(None);
        }
        let key = |k: &str| format!("{HADAMARD_PREFIX}{k}");
        let bad = |k: &str, why: String| file.metadata_error(&key(k), why);
        if let Some(unknown) = present.iter().find(|k| !HADAMARD_KEYS.contains(k)) {
            return Err(bad(
                unknown,
                "is not a key of rotation metadata version 1; this file needs a newer onepass"
                    .into(),
            ));
        }

        let version = file.u64_value(&key("version"))?;
        if version != 1 {
            return Err(bad(
                "version",
                format!("version {version} is not supported (onepass reads version 1)"),
            ));
        }
        let block = file.u64_value(&key("block_size"))?;
        if block != HADAMARD_BLOCK as u64 {
            return Err(bad(
                "block_size",
                format!("{block} is not supported (onepass reads {HADAMARD_BLOCK})"),
            ));
        }
        for (k, want) in [
            ("transform", HADAMARD_TRANSFORM),
            ("axis", HADAMARD_AXIS),
            ("sign_mode", "explicit"),
        ] {
            let got = file.str_value(&key(k))?;
            if got != want {
                return Err(bad(
                    k,
                    format!("{got:?} is not supported (onepass reads {want:?})"),
                ));
            }
        }

        let widths_array = file.array_value(&key("sign_widths"))?;
        let widths = widths_array.to_i128_vec().ok_or_else(|| {
            bad(
                "sign_widths",
                format!(
                    "expected an integer array, found array[{}]",
                    widths_array.element_type_name()
                ),
            )
        })?;
        if widths.is_empty() {
            return Err(bad("sign_widths", "is empty".into()));
        }
        let mut seen = BTreeSet::new();
        for &w in &widths {
            if w <= 0 || w % HADAMARD_BLOCK as i128 != 0 || w > u32::MAX as i128 {
                return Err(bad(
                    "sign_widths",
                    format!("width {w} is not a positive multiple of {HADAMARD_BLOCK}"),
                ));
            }
            if !seen.insert(w) {
                return Err(bad("sign_widths", format!("width {w} appears twice")));
            }
        }

        let values_array = file.array_value(&key("sign_values"))?;
        let values: Vec<f64> = if let Some(v) = values_array.to_i128_vec() {
            v.into_iter().map(|x| x as f64).collect()
        } else if let Some(v) = values_array.to_f64_vec() {
            v
        } else {
            return Err(bad(
                "sign_values",
                format!(
                    "expected an integer or float array, found array[{}]",
                    values_array.element_type_name()
                ),
            ));
        };
        let widths: Vec<usize> = widths.iter().map(|&w| w as usize).collect();
        let signs: BTreeMap<usize, Vec<f32>> = split_signs(&widths, &values)
            .map_err(|m| bad("sign_values", m))?
            .into_iter()
            .collect();

        let names = |k: &str| -> Result<BTreeSet<String>, GgufError> {
            let array = file.array_value(&key(k))?;
            let list = array.as_strings().ok_or_else(|| {
                bad(
                    k,
                    format!(
                        "expected a string array, found array[{}]",
                        array.element_type_name()
                    ),
                )
            })?;
            let mut set = BTreeSet::new();
            for name in list {
                let Some(t) = file.tensor(name) else {
                    return Err(bad(
                        k,
                        format!("names {name:?}, which is not a tensor of the file"),
                    ));
                };
                if !signs.contains_key(&(t.ne[0] as usize)) {
                    return Err(bad(
                        k,
                        format!(
                            "tensor {name:?} has input width {}, which has no sign vector in sign_widths",
                            t.ne[0]
                        ),
                    ));
                }
                if !set.insert(name.clone()) {
                    return Err(bad(k, format!("names {name:?} twice")));
                }
            }
            Ok(set)
        };
        let weight_names = names("weight_names")?;
        let inverse_weight_names = names("inverse_weight_names")?;
        if let Some(both) = weight_names.intersection(&inverse_weight_names).next() {
            return Err(bad(
                "inverse_weight_names",
                format!("names {both:?}, which weight_names also names"),
            ));
        }

        let gdn_v_grouped = match file.get(&key("gdn_v_grouped")) {
            None => false,
            Some(GgufValue::Bool(b)) => *b,
            Some(v) => {
                return Err(bad(
                    "gdn_v_grouped",
                    format!("expected a bool, found {}", v.type_name()),
                ))
            }
        };
        Ok(Some(HadamardMeta {
            signs,
            weight_names,
            inverse_weight_names,
            gdn_v_grouped,
        }))
    }

    /// The sign vector for activations of width `k`, if the file declares one.
    pub fn signs_for(&self, k: usize) -> Option<&[f32]> {
        self.signs.get(&k).map(Vec::as_slice)
    }

    /// Whether `name` is folded (its input is rotated before the matmul).
    pub fn is_folded(&self, name: &str) -> bool {
        self.weight_names.contains(name)
    }
}
