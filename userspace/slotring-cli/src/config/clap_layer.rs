//! Clap with the environment off, and clap's errors as [`ConfigError`]s
//! that name the option, the value and its origin.

use clap::{Arg, Command};

use super::*;

/// `cmd` with every environment variable turned off (in its subcommands
/// too): [`RunConfig::overlay`] reads the environment, so that the file can
/// sit below it and a bad value names its variable.
pub fn without_env(cmd: Command) -> Command {
    cmd.mut_args(|a| a.env(None::<&'static str>))
        .mut_subcommands(without_env)
}

/// A command-line value that one of this module's parsers rejected, as a
/// [`ConfigError`] naming the option, the value and the command line;
/// every other clap error is handed back. `cmd` is the command that
/// produced `err`.
pub fn command_line_error(err: clap::Error, cmd: &Command) -> Result<ConfigError, clap::Error> {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    let context = |kind| match err.get(kind) {
        Some(ContextValue::String(s)) => Some(s.clone()),
        _ => None,
    };
    let (Some(rendered), Some(value)) = (
        context(ContextKind::InvalidArg),
        context(ContextKind::InvalidValue),
    ) else {
        return Err(err);
    };
    let expected = std::error::Error::source(&err).and_then(|s| s.downcast_ref::<Expected>());
    let mut built = cmd.clone();
    built.build();
    match (err.kind(), expected, find_arg(&built, &rendered)) {
        (ErrorKind::ValueValidation, Some(expected), Some(arg)) => Ok(ConfigError::Invalid {
            option: option_name(arg),
            value,
            origin: Origin::CommandLine,
            source: Box::new(*expected),
        }),
        _ => Err(err),
    }
}

/// The argument of `cmd` or its subcommands that clap renders as `rendered`
/// (`--duration <DURATION>`) in its errors.
pub(super) fn find_arg<'a>(cmd: &'a Command, rendered: &str) -> Option<&'a Arg> {
    cmd.get_arguments()
        .find(|a| a.to_string() == rendered)
        .or_else(|| cmd.get_subcommands().find_map(|s| find_arg(s, rendered)))
}

/// `max-local-read-bandwidth` for the setting `max_local_read_bandwidth`
/// (also for the `--no-…` flags, whose values come from the other layers).
pub(super) fn option_name(arg: &Arg) -> String {
    arg.get_id().as_str().replace('_', "-")
}

pub(super) fn invalid(arg: &Arg, value: String, origin: Origin, err: clap::Error) -> ConfigError {
    let source: Box<dyn std::error::Error + Send + Sync> =
        match std::error::Error::source(&err).and_then(|s| s.downcast_ref::<Expected>()) {
            Some(expected) => Box::new(*expected),
            None => Box::new(err),
        };
    ConfigError::Invalid {
        option: option_name(arg),
        value,
        origin,
        source,
    }
}
