-- The audit chain is keyed from here on (src/store/audit.rs): new rows carry
-- `chain = 'hmac-sha256'`, an HMAC under the gateway's key, computed by the SQL function
-- `sluice_audit_mac` that `Db::open` registers on its write connections (the key is never
-- in the database). Rows written before stay plain SHA-256 (`chain = 'sha256'`).
ALTER TABLE audit_log ADD COLUMN chain TEXT NOT NULL DEFAULT 'sha256';

-- Seal the rows written before: one keyed row whose MAC covers their count and, as its
-- `prev_hash`, their last hash. Verification accepts unkeyed rows only as the prefix this
-- row seals. Nothing is inserted into an empty log.
INSERT INTO audit_log (actor, address, action, target, before, after, created_at, prev_hash, hash, chain)
SELECT 'sluice', '', 'audit.keyed', '', NULL, after, at, prev,
       sluice_audit_mac(prev, 'sluice', '', 'audit.keyed', '', NULL, after, at), 'hmac-sha256'
FROM (SELECT json_object('legacy_rows', COUNT(*)) AS after,
             strftime('%Y-%m-%dT%H:%M:%fZ', 'now') AS at,
             (SELECT hash FROM audit_log ORDER BY id DESC LIMIT 1) AS prev
      FROM audit_log)
WHERE prev IS NOT NULL;
