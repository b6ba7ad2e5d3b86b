-- Upstream keys, deployments and models managed in the admin UI and API (see the SQLite
-- migration 0016_keys_managed_catalog.sql for what each column holds).
CREATE TABLE managed_upstreams (
    id          TEXT COLLATE "C" PRIMARY KEY,
    settings    TEXT NOT NULL,
    key_sealed  BYTEA NOT NULL,
    key_last4   TEXT NOT NULL,
    enabled     BOOLEAN NOT NULL DEFAULT TRUE,
    created_at  TEXT COLLATE "C" NOT NULL,
    updated_at  TEXT COLLATE "C" NOT NULL
);
CREATE TABLE managed_models (
    name        TEXT COLLATE "C" PRIMARY KEY,
    settings    TEXT NOT NULL,
    updated_at  TEXT COLLATE "C" NOT NULL
);
CREATE TABLE seal_check (
    id      INTEGER PRIMARY KEY CHECK (id = 1),
    sealed  BYTEA NOT NULL
);
INSERT INTO meta(key, value) VALUES ('catalog_epoch', 0);
