//! The model's record of the Lua scripts (tests/model/scripts.rs), checked
//! in the ordinary test suite too: the model check itself runs only in
//! release (`cargo test --release --test model`), but a script changed
//! without the model's record fails here as well. No state-space search.

#[path = "../model/scripts.rs"]
mod scripts;
