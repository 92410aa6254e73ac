//! The store's layout version and the migrations from the previous ones.
//!
//! Layout 3 kept the compile.lock head unsealed and no key fingerprint; layout 4 seals the
//! head with the chain's key and stores a fingerprint of the key. A layout-3 store is migrated
//! when it is opened with its key: its whole chain (and index) is verified first, so that a
//! chain already altered, or a wrong key, is refused instead of being sealed as good.
//! Layout 5 derives session ids from conversation tokens instead of allocating them from one
//! id space: the `sid:<id>` allocation index of layouts 3 and 4 is dropped (sessions keep
//! their ids). Layout 6 adds the journal (`journal:<seq>`): its keyed records are layout 5's,
//! but a store that may hold state in its journal must not be opened by a build that does not
//! replay it, so the version moves. Layout 7 packs compile.lock records and ledger entries into
//! chunks found through maps in memory ([`super::keyed`]): `lock:`, `lockx:`, `ledger:` and
//! `ledgert:` keys give way to `lockc:` and `ledgerc:` chunks.

use super::keyed::{Keyed, LEDGER, LEDGER_TIME, LOCK, LOCK_INDEX};
use super::{HEAD_KEY, KEY_FINGERPRINT, SledStore, corrupt, unavailable};
use crate::gateway::store::StoreError;
use crate::store::chain::{self, Sealer};
use serde::Deserialize;

/// The layout version written into the store; a store with another version is refused.
pub const SCHEMA_VERSION: &str = "7";
/// The layouts migrated from.
const LAYOUT_3: &str = "3";
const LAYOUT_4: &str = "4";
const LAYOUT_5: &str = "5";
const LAYOUT_6: &str = "6";
/// Layouts 3 and 4: session id -> conversation token, the allocation index.
const SESSION_ID: &[u8] = b"sid:";

const SCHEMA_KEY: &[u8] = b"meta:schema_version";

/// Layout 3's head: the record count and last hash, without a seal.
#[derive(Deserialize)]
struct UnsealedHead {
    records: u64,
    last_hash: String,
}

fn version(db: &sled::Db) -> Result<Option<String>, StoreError> {
    Ok(db.get(SCHEMA_KEY).map_err(unavailable)?.map(|v| String::from_utf8_lossy(&v).into_owned()))
}

fn refuse(found: Option<&str>) -> StoreError {
    corrupt(format!(
        "store schema version {} is not {SCHEMA_VERSION}; migrate or start from an empty store",
        found.unwrap_or("none")
    ))
}

/// Brings the store to the current layout: a new store is initialised for `sealer`'s key, an
/// older one migrated, any other refused.
pub(super) fn to_current(keyed: &Keyed, sealer: &Sealer) -> Result<(), StoreError> {
    let db = keyed.db();
    match version(db)?.as_deref() {
        Some(SCHEMA_VERSION) => Ok(()),
        None if db.is_empty() => initialise(db, sealer),
        Some(LAYOUT_3) => {
            pack_alone(keyed)?;
            from_3(keyed, sealer)?;
            upgrade(keyed)
        }
        Some(LAYOUT_4 | LAYOUT_5 | LAYOUT_6) => upgrade(keyed),
        found => Err(refuse(found)),
    }
}

/// Brings a store opened without its key to a layout it can be read in: the current one, or,
/// for layout 3 (whose head is sealed only once it is opened with its key), its records packed.
/// None of this needs the key: it changes how the records are kept, not what they say.
pub(super) fn to_readable(keyed: &Keyed) -> Result<(), StoreError> {
    match version(keyed.db())?.as_deref() {
        Some(SCHEMA_VERSION) => Ok(()),
        Some(LAYOUT_3) => pack_alone(keyed),
        Some(LAYOUT_4 | LAYOUT_5 | LAYOUT_6) => upgrade(keyed),
        found => Err(refuse(found)),
    }
}

fn initialise(db: &sled::Db, sealer: &Sealer) -> Result<(), StoreError> {
    stamp(db, &sealer.head(0, chain::GENESIS), sealer)
}

/// Writes the sealed head, the key fingerprint and the current version in one atomic step.
fn stamp(db: &sled::Db, head: &chain::Head, sealer: &Sealer) -> Result<(), StoreError> {
    let mut batch = sled::Batch::default();
    batch.insert(HEAD_KEY, super::encode(head));
    batch.insert(KEY_FINGERPRINT, sealer.fingerprint().as_bytes());
    batch.insert(SCHEMA_KEY, SCHEMA_VERSION);
    db.apply_batch(batch).map_err(unavailable)?;
    db.flush().map_err(unavailable)?;
    Ok(())
}

fn from_3(keyed: &Keyed, sealer: &Sealer) -> Result<(), StoreError> {
    let db = keyed.db();
    let head = match db.get(HEAD_KEY).map_err(unavailable)? {
        Some(bytes) => super::decode::<UnsealedHead>(&bytes, "compile.lock head")?,
        None => UnsealedHead { records: 0, last_hash: chain::GENESIS.to_owned() },
    };
    let sealed = sealer.head(head.records, &head.last_hash);
    // Verified through a store view that cannot write, with the unsealed head sealed here.
    let view = SledStore::with(Keyed::load(db.clone())?, sealer.clone(), true);
    let records = view.lock_records();
    let count = chain::verify(records, Some(&sealed), sealer).map_err(|e| cannot_migrate(sealer, &e))?;
    view.verify_index(count).map_err(|e| cannot_migrate(sealer, &e))?;
    stamp(db, &sealed, sealer)
}

/// Layouts 4 to 6 to the current one, in one atomic step with the new version: the session id
/// index of layout 4 is dropped, and the records are packed.
fn upgrade(keyed: &Keyed) -> Result<(), StoreError> {
    let db = keyed.db();
    let mut batch = sled::Batch::default();
    for key in db.scan_prefix(SESSION_ID).keys() {
        batch.remove(key.map_err(unavailable)?);
    }
    pack(keyed, &mut batch)?;
    batch.insert(SCHEMA_KEY, SCHEMA_VERSION);
    db.apply_batch(batch).map_err(unavailable)?;
    db.flush().map_err(unavailable)?;
    Ok(())
}

/// Packs the records in one atomic step, leaving the version as it is: layout 3 is verified,
/// and its head sealed, only once its records are where the store reads them.
fn pack_alone(keyed: &Keyed) -> Result<(), StoreError> {
    let mut batch = sled::Batch::default();
    pack(keyed, &mut batch)?;
    keyed.db().apply_batch(batch).map_err(unavailable)?;
    keyed.db().flush().map(drop).map_err(unavailable)
}

/// Moves every compile.lock record and ledger entry into its chunk, and drops the stored
/// compile.lock index and ledger time index (the maps that replace them are rebuilt at every
/// open). Packing twice packs nothing more.
fn pack(keyed: &Keyed, batch: &mut sled::Batch) -> Result<(), StoreError> {
    let db = keyed.db();
    let mut moved = Vec::new();
    for prefix in [LOCK, LEDGER] {
        for entry in db.scan_prefix(prefix) {
            let (key, value) = entry.map_err(unavailable)?;
            batch.remove(key.clone());
            moved.push((key, value));
        }
    }
    for prefix in [LOCK_INDEX, LEDGER_TIME] {
        for key in db.scan_prefix(prefix).keys() {
            batch.remove(key.map_err(unavailable)?);
        }
    }
    keyed.apply(moved.iter().map(|(k, v)| (k.as_ref(), Some(v.as_ref()))), |key, value| {
        match value {
            Some(value) => batch.insert(key, value),
            None => batch.remove(key),
        }
        Ok(())
    })
}

fn cannot_migrate(sealer: &Sealer, e: &chain::ChainError) -> StoreError {
    let hint = if sealer.is_keyed() {
        "the key given is not this store's key, or the chain was altered"
    } else {
        "the store is keyed (open it with its key), or the chain was altered"
    };
    StoreError::Key(format!(
        "cannot migrate the store from schema version {LAYOUT_3}: compile.lock {e}; {hint}"
    ))
}
