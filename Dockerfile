# Multi-stage build: compile with the locked dependency set, run as a non-root user on a
# slim Debian base (glibc, CA certificates for the providers' TLS; nothing else).
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock build.rs ./
COPY src src
COPY migrations migrations
COPY templates templates
COPY static static
COPY link link
COPY .cargo .cargo
RUN cargo build --release --locked && strip target/release/sluice

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --home-dir /var/lib/sluice --shell /usr/sbin/nologin sluice \
 && mkdir -p /var/lib/sluice/data /var/lib/sluice/backup /etc/sluice \
 && chown -R sluice:sluice /var/lib/sluice
COPY --from=build /src/target/release/sluice /usr/local/bin/sluice
USER sluice
WORKDIR /var/lib/sluice
ENV SLUICE_SERVER_LISTEN=0.0.0.0:8080 \
    SLUICE_DATABASE_URL=sqlite:///var/lib/sluice/data/sluice.db \
    SLUICE_BACKUP_DIR=/var/lib/sluice/backup
EXPOSE 8080
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=10s --timeout=3s --retries=3 \
  CMD ["bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/8080 && printf 'GET /healthz HTTP/1.0\\r\\n\\r\\n' >&3 && grep -q ' 200 ' <&3"]
ENTRYPOINT ["/usr/local/bin/sluice"]
CMD ["serve"]
