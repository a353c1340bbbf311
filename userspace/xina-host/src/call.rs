//! What the drivers run for one collective call of any element type: a
//! [`Plan`] of one or more integer engine runs.
//!
//! Integer calls are one run of the [`Engine`](crate::Engine). A float call
//! is several ([`crate::float`]): agree on a scale, run the fixed-point
//! integers, redo what overflowed. Plans are sans-IO like the engine, so
//! the blocking [`Worker`](crate::Worker) and the tokio
//! [`AsyncWorker`](crate::AsyncWorker) share them.

use std::ops::Range;

use crate::engine::{Collective, Config, Member, Stats};
use crate::error::Error;

/// The integer buffer of one engine run.
#[derive(Debug)]
pub enum StepData<'b> {
    /// An int32 run.
    I32(&'b mut [i32]),
    /// An int64 run.
    I64(&'b mut [i64]),
}

/// One engine run a plan asks for.
#[derive(Debug)]
pub struct Step<'b> {
    /// The collective to run.
    pub collective: Collective,
    /// Its buffer, combined in place.
    pub data: StepData<'b>,
    /// Whether overflowed results are reported back (in
    /// [`StepOutcome::overflowed`]) instead of failing the run.
    pub tolerate_overflow: bool,
}

/// What an engine run gave.
#[derive(Debug)]
pub struct StepOutcome {
    /// The run's counters.
    pub stats: Stats,
    /// With [`Step::tolerate_overflow`]: the buffer ranges whose results
    /// carried the overflow flag.
    pub overflowed: Vec<Range<usize>>,
}

/// A collective call as a sequence of engine runs.
///
/// A driver loops: take the next [`Step`], run it, [`feed`](Self::feed) the
/// outcome back, until [`next`](Self::next) returns `None`; then
/// [`finish`](Self::finish).
pub trait Plan: Send {
    /// The next run, `None` when the call is over (done or failed).
    fn next(&mut self) -> Option<Step<'_>>;
    /// The outcome of the run [`next`](Self::next) returned last.
    fn feed(&mut self, outcome: Result<StepOutcome, Error>);
    /// The call's result: its counters, or the first failure.
    ///
    /// # Errors
    /// The failure of a run, or of the plan itself (non-finite floats).
    fn finish(self: Box<Self>) -> Result<Stats, Error>;
}

/// The element types of collective calls: `i32`, `i64` (carried as they are)
/// and `f32` (carried as fixed-point int32, see [`crate::float`]).
pub trait Scalar: Copy + Send + Sync + 'static + sealed::Sealed {
    /// The type's name in messages.
    const NAME: &'static str;

    /// The plan of `collective` over `data`.
    ///
    /// # Errors
    /// Arguments the call cannot run with (see [`Engine::new`](crate::Engine::new)).
    fn plan<'a>(
        member: &Member,
        config: &Config,
        collective: Collective,
        data: &'a mut [Self],
    ) -> Result<Box<dyn Plan + 'a>, Error>;
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for i32 {}
    impl Sealed for i64 {}
    impl Sealed for f32 {}
}

/// One engine run over the caller's integers.
struct Direct<'a> {
    step: Option<Step<'a>>,
    outcome: Option<Result<StepOutcome, Error>>,
    taken: bool,
}

impl Plan for Direct<'_> {
    fn next(&mut self) -> Option<Step<'_>> {
        if self.taken {
            return None;
        }
        self.taken = true;
        let step = self.step.as_mut()?;
        let data = match &mut step.data {
            StepData::I32(d) => StepData::I32(d),
            StepData::I64(d) => StepData::I64(d),
        };
        Some(Step {
            collective: step.collective,
            data,
            tolerate_overflow: false,
        })
    }

    fn feed(&mut self, outcome: Result<StepOutcome, Error>) {
        self.outcome = Some(outcome);
    }

    fn finish(self: Box<Self>) -> Result<Stats, Error> {
        match self.outcome {
            Some(outcome) => outcome.map(|o| o.stats),
            None => unreachable!("a driver finishes a plan after running its step"),
        }
    }
}

fn direct<'a>(
    member: &Member,
    collective: Collective,
    dtype: xina_proto::DType,
    data: StepData<'a>,
    name: &str,
) -> Result<Box<dyn Plan + 'a>, Error> {
    if member.dtype != dtype {
        return Err(Error::WrongType {
            job: member.job,
            job_dtype: member.dtype,
            call: format!("{} of {name}", collective.name()),
        });
    }
    Ok(Box::new(Direct {
        step: Some(Step {
            collective,
            data,
            tolerate_overflow: false,
        }),
        outcome: None,
        taken: false,
    }))
}

/// The integer element types, carried as they are.
macro_rules! direct_scalar {
    ($t:ty, $name:literal, $dtype:ident) => {
        impl Scalar for $t {
            const NAME: &'static str = $name;

            fn plan<'a>(
                member: &Member,
                _: &Config,
                collective: Collective,
                data: &'a mut [Self],
            ) -> Result<Box<dyn Plan + 'a>, Error> {
                direct(
                    member,
                    collective,
                    xina_proto::DType::$dtype,
                    StepData::$dtype(data),
                    Self::NAME,
                )
            }
        }
    };
}

direct_scalar!(i32, "int32", I32);
direct_scalar!(i64, "int64", I64);

impl Scalar for f32 {
    const NAME: &'static str = "float32";

    fn plan<'a>(
        member: &Member,
        config: &Config,
        collective: Collective,
        data: &'a mut [Self],
    ) -> Result<Box<dyn Plan + 'a>, Error> {
        if member.dtype != xina_proto::DType::I32 {
            return Err(Error::WrongType {
                job: member.job,
                job_dtype: member.dtype,
                call: format!("{} of {}", collective.name(), Self::NAME),
            });
        }
        Ok(Box::new(crate::float::FloatPlan::new(
            *member, config, collective, data,
        )))
    }
}
