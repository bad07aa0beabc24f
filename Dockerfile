FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY pg2sink ./pg2sink
RUN pip install --no-cache-dir '.[kafka]'
ENTRYPOINT []
CMD ["pg2sink", "--help"]
