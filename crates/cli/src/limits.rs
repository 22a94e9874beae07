//! The request limits of decider-ai's server (decider-contract §1.10, R6.3), read the same way by `onepass serve` and
//! `onepass systemone`: `--flag`, else the reference's environment variable, else the reference default. One place,
//! so both commands refuse (413) or cut the state of the same body the same way.

use anyhow::{Context, Result};
use clap::Args;
use onepass_decide::{Limits, DEFAULT_MAX_STATE_TOKENS};

/// The per-request limits (every flag falls back to its environment variable, then to the reference's default).
#[derive(Args, Debug, Clone, Default)]
pub struct LimitArgs {
    /// Scoring rows per request; more answers 413 [env DECIDER_MAX_ROWS, default 1024].
    #[arg(long)]
    max_rows: Option<usize>,
    /// Tokens in one row; more answers 413 [env DECIDER_MAX_ROW_TOKENS, default max-state-tokens + 4096].
    #[arg(long)]
    max_row_tokens: Option<usize>,
    /// Sum of row lengths of one request; more answers 413 [env DECIDER_MAX_REQUEST_TOKENS, default 1048576].
    #[arg(long)]
    max_request_tokens: Option<usize>,
    /// State tokens kept per row (`"Context:\n" + state` is cut there) [env DECIDER_MAX_STATE_TOKENS, default 32768].
    #[arg(long)]
    max_state_tokens: Option<usize>,
}

/// [`LimitArgs`] resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestLimits {
    /// The 413 checks (`check_size`).
    pub limits: Limits,
    /// `DECIDER_MAX_STATE_TOKENS`: cap on the ids of `"Context:\n" + state`.
    pub max_state_tokens: usize,
}

impl LimitArgs {
    /// The flags, else the environment, else the defaults; an unparsable variable is an error that names it.
    pub fn resolve(&self) -> Result<RequestLimits> {
        let max_state_tokens = setting(
            self.max_state_tokens,
            "DECIDER_MAX_STATE_TOKENS",
            DEFAULT_MAX_STATE_TOKENS,
        )?;
        let defaults = Limits::default();
        Ok(RequestLimits {
            limits: Limits {
                max_rows: setting(self.max_rows, "DECIDER_MAX_ROWS", defaults.max_rows)?,
                max_row_tokens: setting(
                    self.max_row_tokens,
                    "DECIDER_MAX_ROW_TOKENS",
                    max_state_tokens + 4096,
                )?,
                max_request_tokens: setting(
                    self.max_request_tokens,
                    "DECIDER_MAX_REQUEST_TOKENS",
                    defaults.max_request_tokens,
                )?,
            },
            max_state_tokens,
        })
    }
}

/// `--flag`, else the environment variable `env`, else `default`.
pub fn setting(flag: Option<usize>, env: &str, default: usize) -> Result<usize> {
    if let Some(v) = flag {
        return Ok(v);
    }
    match std::env::var(env) {
        Ok(s) => s
            .trim()
            .parse()
            .with_context(|| format!("{env}={s:?} is not a non-negative integer")),
        Err(_) => Ok(default),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_win_and_the_state_cap_reaches_the_config() {
        // Flags only: no environment read (every flag given, so the test does not depend on the process environment).
        let a = LimitArgs {
            max_rows: Some(3),
            max_row_tokens: Some(50),
            max_request_tokens: Some(70),
            max_state_tokens: Some(9),
        };
        let r = a.resolve().expect("resolve");
        assert_eq!(
            r.limits,
            Limits {
                max_rows: 3,
                max_row_tokens: 50,
                max_request_tokens: 70
            }
        );
        assert_eq!(r.max_state_tokens, 9);
        assert_eq!(
            setting(Some(1), "ONEPASS_TEST_UNSET_VARIABLE", 5).ok(),
            Some(1)
        );
        assert_eq!(
            setting(None, "ONEPASS_TEST_UNSET_VARIABLE", 5).ok(),
            Some(5)
        );
    }
}
