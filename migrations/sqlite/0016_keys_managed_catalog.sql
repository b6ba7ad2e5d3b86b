-- Upstream keys, deployments and models managed in the admin UI and API (issue 19), beside
-- those of the config file. A key is stored sealed only (AES-256-GCM under a subkey of the
-- master key, its row's purpose as associated data: `secrets::seal`), with its last 4
-- characters for display; `settings` is the `[[upstreams]]` / `[[models]]` table as JSON,
-- without the key.
CREATE TABLE managed_upstreams (
    id          TEXT PRIMARY KEY,
    settings    TEXT NOT NULL,
    key_sealed  BLOB NOT NULL,
    key_last4   TEXT NOT NULL,
    enabled     INTEGER NOT NULL DEFAULT 1,
    created_at  TEXT NOT NULL,
    updated_at  TEXT NOT NULL
);
CREATE TABLE managed_models (
    name        TEXT PRIMARY KEY,
    settings    TEXT NOT NULL,
    updated_at  TEXT NOT NULL
);
-- One value sealed at the first start, so a start with another master key is refused
-- instead of failing on every key it cannot open.
CREATE TABLE seal_check (
    id      INTEGER PRIMARY KEY CHECK (id = 1),
    sealed  BLOB NOT NULL
);
-- Bumped by every change to the rows above: every replica polls it and rebuilds its catalog.
INSERT INTO meta(key, value) VALUES ('catalog_epoch', 0);
