DROP TABLE IF EXISTS notifications;
