//! Bringing a switch up from a [`Config`]: load, attach every port, install
//! every job. All or nothing: on error, whatever was attached is detached
//! again (by dropping the [`Dataplane`]).

use aya::programs::XdpMode;

use crate::{
    config::{Config, ConfigError, XdpModeName},
    dataplane::{self, Dataplane, LoadOptions},
    netdev,
    pin::PinDir,
};

/// Why a switch could not be brought up.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Dataplane(#[from] Box<dataplane::Error>),
    #[error("port {port}")]
    Port {
        port: String,
        #[source]
        source: Box<dataplane::Error>,
    },
}

/// Loads the dataplane, attaches it to `config.switch.ports` and installs
/// `config.jobs`. Must run on a thread inside the switch's network namespace.
///
/// # Errors
/// The first failure; nothing stays attached or installed.
pub fn start(config: &Config) -> Result<Dataplane, StartError> {
    let dp = Dataplane::load(load_options(config)).map_err(Box::new)?;
    fill(dp, config)
}

/// Like [`start`], with the switch pinned under `dir` (see
/// [`Dataplane::load_pinned`]): it stays up after this process exits.
///
/// # Errors
/// The first failure; then nothing stays attached, installed or pinned.
pub fn start_pinned(config: &Config, dir: &PinDir) -> Result<Dataplane, StartError> {
    let dp = Dataplane::load_pinned(load_options(config), dir).map_err(Box::new)?;
    fill(dp, config).inspect_err(|_| {
        // The failed dataplane was dropped without detaching; the pins go too.
        if let Err(e) = crate::pin::remove(dir) {
            log::warn!("removing {}: {e}", dir.path().display());
        }
    })
}

/// What a switch of `config` is loaded with (map sizes, logging).
pub fn load_options(config: &Config) -> LoadOptions {
    LoadOptions {
        slot_pool: config.switch.slot_pool,
        units: config.switch.units,
        debug: config.switch.debug,
    }
}

/// Attaches `dp` to the ports and installs the jobs.
fn fill(mut dp: Dataplane, config: &Config) -> Result<Dataplane, StartError> {
    for port in &config.switch.ports {
        attach(&mut dp, port, config.switch.xdp_mode).map_err(|source| StartError::Port {
            port: port.clone(),
            source: Box::new(source),
        })?;
    }
    for (i, job) in config.jobs.iter().enumerate() {
        crate::control::check_mtu(&format!("jobs[{i}]."), job)?;
    }
    let jobs = config.resolve(|name| {
        let ifindex = dp.ports().iter().find(|p| p.name == name)?.ifindex;
        Some((ifindex, netdev::mac(name).ok()?))
    })?;
    for job in &jobs {
        dp.install_job(job).map_err(Box::new)?;
    }
    Ok(dp)
}

/// Attaches one port in the configured mode; `auto` tries native XDP first
/// and falls back to generic XDP when the driver has no native support.
fn attach(dp: &mut Dataplane, port: &str, mode: XdpModeName) -> Result<(), dataplane::Error> {
    match mode {
        XdpModeName::Native => dp.attach(port, XdpMode::Driver).map(drop),
        XdpModeName::Generic => dp.attach(port, XdpMode::Skb).map(drop),
        XdpModeName::Auto => match dp.attach(port, XdpMode::Driver) {
            Ok(_) => Ok(()),
            Err(dataplane::Error::Attach { source, .. }) => {
                log::info!("{port}: native XDP refused ({source}); using generic XDP");
                dp.attach(port, XdpMode::Skb).map(drop)
            }
            Err(e) => Err(e),
        },
    }
}
