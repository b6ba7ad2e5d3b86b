-- Single sign-on: see migrations/sqlite/0015_sso_identities.sql.
ALTER TABLE admins ADD COLUMN oidc_issuer TEXT COLLATE "C";
ALTER TABLE admins ADD COLUMN oidc_subject TEXT COLLATE "C";
ALTER TABLE admins ADD COLUMN break_glass BOOLEAN NOT NULL DEFAULT FALSE;
CREATE UNIQUE INDEX admins_oidc_identity ON admins(oidc_issuer, oidc_subject)
    WHERE oidc_issuer IS NOT NULL;
